package guard

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"gopkg.in/yaml.v3"

	"github.com/seckillguard/seckillguard/ginmw"
)

// Policies are per-route settings loaded from one YAML file, so that a
// service guards all its routes in one place:
//
//	defaults:              # apply to every route below
//	  wait: 2s
//	  fail: closed         # or open
//	routes:
//	  - route: POST /api/seckill/:sku     # method and path exactly as registered in gin
//	    lock: "sku:<sku>"                 # key template
//	    wait: 500ms
//	  - route: POST /api/orders
//	    idempotency:
//	      scope: "<ctx:user_id>"
//	      required: true     # the default: a request without a key is answered 400
//	      ttl: 24h
//
// Route and default keys: lock (a key template; the route takes the lock),
// wait, lease, busy_status, busy_error, retry_after, fail (open|closed),
// body_limit (bytes), long_hold, idempotency. Idempotency keys: scope (a
// template) or unscoped: true, header, key (a template instead of the
// header), required (default true), fingerprint (auto|raw|json or a list of
// fields), ttl, in_progress_lease, wait_for_first, store_client_errors,
// store_server_errors, max_response, replay_headers.
// Durations are Go durations ("500ms", "2s"). A route with both a lock and
// idempotency runs them as Idempotent around Lock would, which gives the
// same answers as any other order (see Idempotent).
type Policies struct {
	name   string
	routes []*RoutePolicy
}

// A RoutePolicy is the policy of one route.
type RoutePolicy struct {
	Method string // "POST"
	Path   string // "/api/seckill/:sku", as registered in gin
	Line   int    // where the route is defined in the file

	lock *ginmw.Template
	idem bool
	opts []RouteOption
}

// LockTemplate returns the route's lock key template, or "" when the route
// takes no lock.
func (rp *RoutePolicy) LockTemplate() string {
	if rp.lock == nil {
		return ""
	}
	return rp.lock.String()
}

// Idempotent reports whether the route is idempotent.
func (rp *RoutePolicy) Idempotent() bool { return rp.idem }

// Routes returns the route policies in file order.
func (p *Policies) Routes() []*RoutePolicy { return append([]*RoutePolicy(nil), p.routes...) }

// LoadPolicies reads a policy file. Its errors name the file and the line:
// unknown fields, bad durations, bad templates, invalid values (as the
// options' constructors check them), routes defined twice (method and path
// compared as gin matches them, whatever the spacing), a path with a space,
// settings that contradict each other in one idempotency block (scope with
// unscoped: true, header with key, in_progress_lease with a wait_for_first
// above 0), a lock setting (wait, lease, busy_status, busy_error,
// long_hold) on a route that takes no lock, where it would do nothing, and
// a second YAML document are all refused. The defaults may hold settings
// of either kind: they apply to the routes that read them.
func LoadPolicies(path string) (*Policies, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("guard: policies: %w", err)
	}
	return ParsePolicies(path, data)
}

// ParsePolicies is LoadPolicies for policies already in memory (an embedded
// file); name is used in errors.
func ParsePolicies(name string, data []byte) (*Policies, error) {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("guard: %s: empty policy file", name)
		}
		return nil, fmt.Errorf("guard: %s: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	// A second document would be ignored: whoever wrote it meant it to
	// count (two files pasted together, a "---" separating environments).
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		line := next.Line
		if err != nil || line == 0 {
			line = docEnd(data, &doc)
		}
		return nil, fmt.Errorf("guard: %s: line %d: a second YAML document; a policy file holds one", name, line)
	}
	// Unknown fields are refused everywhere; yaml.v3's own check does not
	// reach into values with custom decoders.
	if err := checkKnown(&doc, reflect.TypeOf(policyFile{})); err != nil {
		return nil, fmt.Errorf("guard: %s: %w", name, err)
	}
	var f policyFile
	if err := doc.Decode(&f); err != nil {
		return nil, fmt.Errorf("guard: %s: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	p := &Policies{name: name}
	seen := make(map[string]int)
	for _, rs := range f.Routes {
		if rs.Route.value == "" {
			return nil, fmt.Errorf("guard: %s: line %d: a route entry needs \"route: METHOD /path\"", name, rs.line)
		}
		rp, err := rs.policy(&f.Defaults)
		if err != nil {
			return nil, fmt.Errorf("guard: %s: %w", name, err)
		}
		// The route as gin matches it: "POST  /a " and "POST /a" are one.
		route := rp.Method + " " + rp.Path
		if prev, dup := seen[route]; dup {
			return nil, fmt.Errorf("guard: %s: line %d: route %q is already defined at line %d", name, rs.Route.line, route, prev)
		}
		seen[route] = rs.Route.line
		p.routes = append(p.routes, rp)
	}
	return p, nil
}

// Unmatched returns the policies that name no route of routes (r.Routes()),
// as "METHOD /path (line N)": usually a typo, or a route renamed in code.
func (p *Policies) Unmatched(routes gin.RoutesInfo) []string {
	have := make(map[string]bool, len(routes))
	for _, r := range routes {
		have[r.Method+" "+r.Path] = true
	}
	var out []string
	for _, rp := range p.routes {
		if !have[rp.Method+" "+rp.Path] {
			out = append(out, fmt.Sprintf("%s %s (line %d)", rp.Method, rp.Path, rp.Line))
		}
	}
	return out
}

// With returns a copy of p in which the route named "METHOD /path" (as in
// the file) also takes opts, after the file's own: the way to give a route
// what a file cannot say, such as Combining(gormplugin.Batch(db)). An option
// is refused exactly where it would do nothing, as Lock and Idempotent
// refuse it: a lock option on a route that takes no lock, an idempotency
// option on a route without idempotency, MaxBatch without Combining. The
// error names a route p does not have, or the refused option and the
// route's line.
func (p *Policies) With(route string, opts ...RouteOption) (*Policies, error) {
	words := strings.Fields(route)
	if len(words) != 2 {
		return nil, fmt.Errorf("guard: %s: With(%q): want \"METHOD /path\"", p.name, route)
	}
	out := &Policies{name: p.name, routes: make([]*RoutePolicy, len(p.routes))}
	found := false
	for i, rp := range p.routes {
		out.routes[i] = rp
		if rp.Method != words[0] || rp.Path != words[1] {
			continue
		}
		if err := rp.check(opts); err != nil {
			return nil, fmt.Errorf("guard: %s: With(%q): %w", p.name, route, err)
		}
		cp := *rp
		cp.opts = append(append([]RouteOption(nil), rp.opts...), opts...)
		out.routes[i] = &cp
		found = true
	}
	if !found {
		return nil, fmt.Errorf("guard: %s: With(%q): no such route in the policies", p.name, route)
	}
	return out, nil
}

// use says which middleware the route runs.
func (rp *RoutePolicy) use() optionUse {
	switch {
	case rp.lock == nil:
		return useIdem
	case !rp.idem:
		return useLock
	}
	return useBoth
}

// check returns the error of opts given to the route after its own
// options: an option the route's middleware does not read, or one invalid
// with the rest.
func (rp *RoutePolicy) check(opts []RouteOption) error {
	r := defaultRoute()
	applyOptions(&r, useBoth, rp.opts)
	applyOptions(&r, rp.use(), opts)
	if r.batchOpts && r.session == nil && rp.lock != nil {
		r.errs = append(r.errs, fmt.Errorf("%w: MaxBatch and MaxBatchTime bound the batches of Combining and do nothing without it", ErrBadOption))
	}
	err := errors.Join(r.errs...)
	switch {
	case err == nil:
		return nil
	case rp.lock == nil:
		return fmt.Errorf("the route takes no lock (line %d): %w", rp.Line, err)
	case !rp.idem:
		return fmt.Errorf("the route has no idempotency (line %d): %w", rp.Line, err)
	}
	return fmt.Errorf("route at line %d: %w", rp.Line, err)
}

// Policies returns router-level middleware (r.Use) that applies p: a request
// whose route has a policy runs its idempotency and then its lock, in that
// order, around the rest of the chain; other requests pass untouched. It
// panics when p is nil or a policy's options are invalid.
func (g *Guard) Policies(p *Policies) gin.HandlerFunc {
	mustf(p != nil, "Policies(nil)")
	byMethod := make(map[string]map[string]step)
	for _, rp := range p.routes {
		r := g.mustRoute(rp.opts, useBoth)
		var s step
		if rp.lock != nil {
			s = g.lockStep(rp.lock, r)
		}
		if rp.idem {
			is := g.idempotentStep(r, s != nil)
			if inner := s; inner != nil {
				s = func(c *gin.Context, next func()) { is(c, func() { inner(c, next) }) }
			} else {
				s = is
			}
		}
		if s == nil {
			continue
		}
		if byMethod[rp.Method] == nil {
			byMethod[rp.Method] = make(map[string]step)
		}
		byMethod[rp.Method][rp.Path] = s
		g.metrics.touch(rp.Method, rp.Path)
		if r.session != nil {
			g.metrics.touchBatch(rp.Method, rp.Path)
		}
	}
	return func(c *gin.Context) {
		if s := byMethod[c.Request.Method][c.FullPath()]; s != nil {
			g.metrics.touch(routeOf(c))
			if g.render != nil {
				ginmw.SetRenderer(c, g.render)
			}
			s(c, c.Next)
		}
	}
}

// The file's shape.

type policyFile struct {
	Defaults settings    `yaml:"defaults"`
	Routes   []routeSpec `yaml:"routes"`
}

type routeSpec struct {
	Route    located[string] `yaml:"route"`
	settings `yaml:",inline"`
	line     int
}

// UnmarshalYAML records the entry's line.
func (rs *routeSpec) UnmarshalYAML(n *yaml.Node) error {
	type plain routeSpec
	if err := n.Decode((*plain)(rs)); err != nil {
		return err
	}
	rs.line = n.Line
	return nil
}

type settings struct {
	Lock        *located[string]        `yaml:"lock"`
	Wait        *located[time.Duration] `yaml:"wait"`
	Lease       *located[time.Duration] `yaml:"lease"`
	BusyStatus  *located[int]           `yaml:"busy_status"`
	BusyError   *located[string]        `yaml:"busy_error"`
	RetryAfter  *located[time.Duration] `yaml:"retry_after"`
	Fail        *located[string]        `yaml:"fail"`
	BodyLimit   *located[int64]         `yaml:"body_limit"`
	LongHold    *located[time.Duration] `yaml:"long_hold"`
	Idempotency *idemSpec               `yaml:"idempotency"`
}

type idemSpec struct {
	Scope             *located[string]        `yaml:"scope"`
	Unscoped          *located[bool]          `yaml:"unscoped"`
	Header            *located[string]        `yaml:"header"`
	Key               *located[string]        `yaml:"key"`
	Required          *located[bool]          `yaml:"required"`
	Fingerprint       *located[[]string]      `yaml:"fingerprint"`
	TTL               *located[time.Duration] `yaml:"ttl"`
	InProgressLease   *located[time.Duration] `yaml:"in_progress_lease"`
	WaitForFirst      *located[time.Duration] `yaml:"wait_for_first"`
	StoreServerErrors *located[bool]          `yaml:"store_server_errors"`
	StoreClientErrors *located[bool]          `yaml:"store_client_errors"`
	MaxResponse       *located[int]           `yaml:"max_response"`
	ReplayHeaders     *located[[]string]      `yaml:"replay_headers"`
	line              int
}

// UnmarshalYAML records the block's line.
func (s *idemSpec) UnmarshalYAML(n *yaml.Node) error {
	type plain idemSpec
	if err := n.Decode((*plain)(s)); err != nil {
		return err
	}
	s.line = n.Line
	return nil
}

// located is a value and the line it came from.
type located[T any] struct {
	value T
	line  int
}

// UnmarshalYAML decodes the value: durations as Go durations, a fingerprint
// given as one word or as a list.
func (l *located[T]) UnmarshalYAML(n *yaml.Node) error {
	l.line = n.Line
	switch p := any(&l.value).(type) {
	case *time.Duration:
		var s string
		if err := n.Decode(&s); err != nil {
			return fmt.Errorf("line %d: want a duration such as \"500ms\" or \"2s\"", n.Line)
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("line %d: bad duration %q: want a Go duration such as \"500ms\" or \"2s\"", n.Line, s)
		}
		*p = d
		return nil
	case *[]string:
		if n.Kind == yaml.ScalarNode {
			var s string
			if err := n.Decode(&s); err != nil {
				return fmt.Errorf("line %d: %v", n.Line, err)
			}
			*p = []string{s}
			return nil
		}
	}
	if err := n.Decode(&l.value); err != nil {
		return fmt.Errorf("line %d: %s", n.Line, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	return nil
}

// policy turns an entry, over the file's defaults, into a RoutePolicy,
// checking every value.
func (rs *routeSpec) policy(defaults *settings) (*RoutePolicy, error) {
	words := strings.Fields(rs.Route.value)
	if len(words) > 2 && validMethod(words[0]) && strings.HasPrefix(words[1], "/") {
		return nil, fmt.Errorf("line %d: route %q: the path has a space; no request matches it (escape it as %%20 as gin registers it)", rs.Route.line, rs.Route.value)
	}
	if len(words) != 2 || !validMethod(words[0]) || !strings.HasPrefix(words[1], "/") {
		return nil, fmt.Errorf("line %d: route %q: want \"METHOD /path\" as registered in gin, e.g. \"POST /api/seckill/:sku\"", rs.Route.line, rs.Route.value)
	}
	method, path := words[0], words[1]
	rp := &RoutePolicy{Method: method, Path: path, Line: rs.Route.line}
	if err := defaults.apply(rp, useBoth); err != nil {
		return nil, err
	}
	// The route's own settings are refused where the route's middleware
	// would not read them, as Lock, Idempotent and Policies.With refuse
	// the options (the defaults set either kind for every route).
	use := useBoth
	switch lock, idem := rp.lock != nil || rs.Lock != nil, rp.idem || rs.Idempotency != nil; {
	case lock && !idem:
		use = useLock
	case idem && !lock:
		use = useIdem
	}
	if err := rs.settings.apply(rp, use); err != nil {
		return nil, err
	}
	if rp.lock == nil && !rp.idem {
		return nil, fmt.Errorf("line %d: route %q has neither lock nor idempotency", rs.Route.line, rs.Route.value)
	}
	return rp, nil
}

// docEnd returns the line after the last line of doc's content, where a
// document that follows it starts.
func docEnd(data []byte, doc *yaml.Node) int {
	// The decoder does not say where an empty document starts: find the
	// "---" after the first document's content.
	last := doc.Line
	var walk func(*yaml.Node)
	walk = func(n *yaml.Node) {
		last = max(last, n.Line)
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(doc)
	for i, line := range strings.Split(string(data), "\n") {
		if i+1 > last && (strings.HasPrefix(line, "---") || strings.HasPrefix(line, "...")) {
			return i + 1
		}
	}
	return last + 1
}

func validMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// apply adds the options s sets to rp, a route whose middleware is use
// (useBoth for the defaults). Each option is checked on its own, so that a
// refused value names its line, and so is one the route's middleware would
// not read.
func (s *settings) apply(rp *RoutePolicy, use optionUse) error {
	add := func(line int, o RouteOption) error {
		if err := checkOption(o); err != nil {
			return fmt.Errorf("line %d: %w", line, err)
		}
		rp.opts = append(rp.opts, o)
		return nil
	}
	if s.Lock != nil {
		t, err := ginmw.ParseTemplate(s.Lock.value)
		if err != nil {
			return fmt.Errorf("line %d: lock: %w", s.Lock.line, err)
		}
		if err := t.CheckRoute(rp.Path); err != nil {
			return fmt.Errorf("line %d: lock: %w", s.Lock.line, err)
		}
		if fit, _ := fitOf(t, rp.Path); fit == fitPass {
			return fmt.Errorf("line %d: lock: template %q takes a path parameter route %q does not have, so it would never lock it; write <query:x> or <body:x> for a field of the query or the body", s.Lock.line, t.String(), rp.Path)
		}
		rp.lock = t
	}
	var err error
	set := func(line int, o RouteOption) {
		if err == nil {
			err = add(line, o)
		}
	}
	// lockSetting is set for a setting only Lock reads: on a route that
	// takes no lock it would do nothing, and is refused.
	lockSetting := func(line int, field string, o RouteOption) {
		if err == nil && use == useIdem {
			err = fmt.Errorf("line %d: %s: the route takes no lock (no lock: here or in the defaults), so it would do nothing", line, field)
		}
		set(line, o)
	}
	if v := s.Wait; v != nil {
		lockSetting(v.line, "wait", Wait(v.value))
	}
	if v := s.Lease; v != nil {
		if v.value == 0 { // 0: the watchdog, also over a lease set in defaults
			lockSetting(v.line, "lease", option(useLock, "Lease", func(r *route) { r.lease = 0 }))
		} else {
			lockSetting(v.line, "lease", Lease(v.value))
		}
	}
	// Status and code are set apart, so that a route may change one and
	// keep the other from the defaults.
	if v := s.BusyStatus; v != nil {
		if err := checkBusy(v.value, "busy"); err != nil {
			return fmt.Errorf("line %d: busy_status %d: %w", v.line, v.value, err)
		}
		lockSetting(v.line, "busy_status", option(useLock, "Busy", func(r *route) { r.busyStatus = v.value }))
	}
	if v := s.BusyError; v != nil {
		if err := checkBusy(http.StatusTooManyRequests, v.value); err != nil {
			return fmt.Errorf("line %d: busy_error %q: %w", v.line, v.value, err)
		}
		lockSetting(v.line, "busy_error", option(useLock, "Busy", func(r *route) { r.busyCode = v.value }))
	}
	if v := s.RetryAfter; v != nil {
		set(v.line, RetryAfter(v.value))
	}
	if v := s.Fail; v != nil {
		switch v.value {
		case "open":
			set(v.line, FailOpen())
		case "closed":
			set(v.line, func(r *route) { r.failOpen = false })
		default:
			return fmt.Errorf("line %d: fail: %q, want open or closed", v.line, v.value)
		}
	}
	if v := s.BodyLimit; v != nil {
		set(v.line, BodyLimit(v.value))
	}
	if v := s.LongHold; v != nil {
		lockSetting(v.line, "long_hold", LongHold(v.value))
	}
	if err != nil {
		return err
	}
	if s.Idempotency != nil {
		return s.Idempotency.apply(rp, add)
	}
	return nil
}

func (is *idemSpec) apply(rp *RoutePolicy, add func(line int, o RouteOption) error) error {
	rp.idem = true
	template := func(v *located[string], what string) error {
		t, err := ginmw.ParseTemplate(v.value)
		if err == nil {
			err = t.CheckRoute(rp.Path)
		}
		if err != nil {
			return fmt.Errorf("line %d: idempotency %s: %w", v.line, what, err)
		}
		return nil
	}
	if is.Scope != nil && is.Unscoped != nil && is.Unscoped.value {
		return fmt.Errorf("line %d: idempotency: scope (line %d) and unscoped: true contradict each other; keep one", is.Unscoped.line, is.Scope.line)
	}
	if is.Header != nil && is.Key != nil {
		return fmt.Errorf("line %d: idempotency: header (line %d) and key (line %d) contradict each other: the key comes from the header or from the template; keep one", max(is.Header.line, is.Key.line), is.Header.line, is.Key.line)
	}
	if is.WaitForFirst != nil && is.WaitForFirst.value > 0 && is.InProgressLease != nil {
		return fmt.Errorf("line %d: idempotency: in_progress_lease (line %d) does nothing with wait_for_first (line %d): a route that waits holds its key by a semaphore permit, renewed by the lock watchdog (lock.WithWatchdogTimeout); keep one", max(is.WaitForFirst.line, is.InProgressLease.line), is.InProgressLease.line, is.WaitForFirst.line)
	}
	var err error
	try := func(line int, o RouteOption) {
		if err == nil {
			err = add(line, o)
		}
	}
	if v := is.Scope; v != nil {
		if err := template(v, "scope"); err != nil {
			return err
		}
		try(v.line, Scope(v.value))
	}
	if v := is.Unscoped; v != nil && v.value {
		try(v.line, Unscoped())
	}
	if v := is.Header; v != nil {
		try(v.line, IdempotencyHeader(v.value))
	}
	if v := is.Key; v != nil {
		if err := template(v, "key"); err != nil {
			return err
		}
		try(v.line, IdempotencyKey(v.value))
	}
	if v := is.Required; v != nil {
		if !v.value {
			try(v.line, OptionalKey())
		} else {
			try(v.line, func(r *route) { r.idem.required = true })
		}
	}
	if v := is.Fingerprint; v != nil {
		fp, ferr := parseFingerprint(v.value)
		if ferr != nil {
			return fmt.Errorf("line %d: idempotency fingerprint: %w", v.line, ferr)
		}
		try(v.line, UseFingerprint(fp))
	}
	if v := is.TTL; v != nil {
		try(v.line, RecordTTL(v.value))
	}
	if v := is.InProgressLease; v != nil {
		try(v.line, InProgressLease(v.value))
	}
	if v := is.WaitForFirst; v != nil {
		try(v.line, WaitForFirst(v.value))
	}
	if v := is.StoreClientErrors; v != nil && v.value {
		try(v.line, StoreClientErrors())
	}
	if v := is.StoreServerErrors; v != nil && v.value {
		try(v.line, StoreServerErrors())
	}
	if v := is.MaxResponse; v != nil {
		try(v.line, MaxResponse(v.value))
	}
	if v := is.ReplayHeaders; v != nil {
		try(v.line, ReplayHeaders(v.value...))
	}
	if err != nil {
		return err
	}
	if is.Scope == nil && (is.Unscoped == nil || !is.Unscoped.value) {
		return fmt.Errorf("line %d: idempotency needs a scope (e.g. scope: \"<ctx:user_id>\") or unscoped: true", is.line)
	}
	return nil
}

func parseFingerprint(words []string) (Fingerprint, error) {
	if len(words) == 1 {
		switch words[0] {
		case "auto":
			return FingerprintAuto, nil
		case "raw":
			return FingerprintRaw, nil
		case "json":
			return FingerprintJSON, nil
		}
	}
	if len(words) == 0 {
		return Fingerprint{}, errors.New("empty")
	}
	for _, w := range words {
		if w == "" || strings.HasPrefix(w, ".") || strings.HasSuffix(w, ".") || strings.Contains(w, "..") {
			return Fingerprint{}, fmt.Errorf("%q: want auto, raw, json or a list of dotted field paths", w)
		}
	}
	sorted := append([]string(nil), words...)
	sort.Strings(sorted)
	return FingerprintFields(sorted...), nil
}

// checkKnown refuses mapping keys that name no field of t (by yaml tag,
// inline structs included), anywhere in n.
func checkKnown(n *yaml.Node, t reflect.Type) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.DocumentNode {
		for _, c := range n.Content {
			if err := checkKnown(c, t); err != nil {
				return err
			}
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Slice:
		if n.Kind == yaml.SequenceNode {
			for _, c := range n.Content {
				if err := checkKnown(c, t.Elem()); err != nil {
					return err
				}
			}
		}
		return nil
	case reflect.Struct:
		if strings.HasPrefix(t.Name(), "located[") {
			return nil // a value, decoded and checked by located.UnmarshalYAML
		}
	default:
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: want a mapping of fields", n.Line)
	}
	fields := make(map[string]reflect.Type)
	var collect func(reflect.Type)
	collect = func(t reflect.Type) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			tag := f.Tag.Get("yaml")
			if tag == "" || tag == "-" {
				continue
			}
			name, opt, _ := strings.Cut(tag, ",")
			if opt == "inline" {
				collect(f.Type)
				continue
			}
			fields[name] = f.Type
		}
	}
	collect(t)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		ft, ok := fields[k.Value]
		if !ok {
			known := make([]string, 0, len(fields))
			for name := range fields {
				known = append(known, name)
			}
			sort.Strings(known)
			return fmt.Errorf("line %d: unknown field %q (known: %s)", k.Line, k.Value, strings.Join(known, ", "))
		}
		if err := checkKnown(v, ft); err != nil {
			return err
		}
	}
	return nil
}
