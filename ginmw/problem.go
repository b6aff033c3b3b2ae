package ginmw

import (
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"
)

// A Renderer writes the body of an answer the framework gives by itself
// (busy, a missing key field, Redis unavailable, a reused idempotency
// key...): its status, its machine-readable code ("busy") and its extra
// members in order (headers such as Retry-After are set already). Abort
// calls it; JSONRenderer is the default and ProblemJSON renders RFC 9457
// problem details.
type Renderer func(c *gin.Context, status int, code string, members []Member)

// A Member is an extra member of an answer, such as "field" or "detail".
type Member struct {
	Name  string
	Value any
}

// rendererKey is the gin context key of the request's Renderer.
const rendererKey = "seckillguard.ginmw.renderer"

// SetRenderer makes Abort answer c through r from now on (nil: the default
// JSONRenderer).
func SetRenderer(c *gin.Context, r Renderer) {
	if r == nil {
		r = JSONRenderer
	}
	c.Set(rendererKey, r)
}

// UseRenderer returns middleware that makes Abort answer the rest of the
// chain through r. It panics when r is nil.
func UseRenderer(r Renderer) gin.HandlerFunc {
	if r == nil {
		panic("ginmw: UseRenderer(nil)")
	}
	return func(c *gin.Context) { c.Set(rendererKey, r) }
}

// ProblemJSON returns a Renderer of RFC 9457 problem details, with
// Content-Type application/problem+json:
//
//	{"type":"<typeBase><code>","title":"Too Many Requests","status":429,"code":"busy", ...}
//
// "type" is typeBase followed by the code, or "about:blank" when typeBase
// is empty (then "title" is the status text, as RFC 9457 asks). A "detail"
// member that is a string becomes the problem's "detail"; the other members
// become extension members after "code", except names of the standard
// members (type, title, status, instance, code), which are left out, and
// values encoding/json cannot encode.
func ProblemJSON(typeBase string) Renderer {
	return func(c *gin.Context, status int, code string, members []Member) {
		typ := "about:blank"
		if typeBase != "" {
			typ = typeBase + code
		}
		buf := make([]byte, 0, 128)
		buf = append(buf, `{"type":`...)
		buf = appendJSONString(buf, typ)
		buf = append(buf, `,"title":`...)
		buf = appendJSONString(buf, http.StatusText(status))
		buf = append(buf, `,"status":`...)
		buf = strconv.AppendInt(buf, int64(status), 10)
		for _, m := range members {
			if d, ok := m.Value.(string); ok && m.Name == "detail" {
				buf = append(buf, `,"detail":`...)
				buf = appendJSONString(buf, d)
			}
		}
		buf = append(buf, `,"code":`...)
		buf = appendJSONString(buf, code)
		for _, m := range members {
			switch m.Name {
			case "type", "title", "status", "instance", "code":
				continue
			case "detail":
				if _, ok := m.Value.(string); ok {
					continue
				}
			}
			buf = appendMember(buf, m)
		}
		buf = append(buf, '}')
		c.Data(status, "application/problem+json", buf)
	}
}
