package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestRun_HelpListsTheCommands: "help", "-h" and "--help" list serve and
// demo on stdout and succeed; "help serve" and "help demo" list their flags.
func TestRun_HelpListsTheCommands(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"help"}, {"-h"}, {"-help"}, {"--help"}} {
		var out bytes.Buffer
		if err := run(context.Background(), args, env(nil), &out, io.Discard); err != nil {
			t.Errorf("%q: %v", args, err)
		}
		for _, want := range []string{"serve", "demo", "help serve"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%q prints no %q:\n%s", args, want, out.String())
			}
		}
	}
	for cmd, flag := range map[string]string{"serve": "-addr", "demo": "-json"} {
		var out bytes.Buffer
		if err := run(context.Background(), []string{"help", cmd}, env(nil), &out, io.Discard); err != nil {
			t.Errorf("help %s: %v", cmd, err)
		}
		if !strings.Contains(out.String(), flag) {
			t.Errorf("help %s lists no %s:\n%s", cmd, flag, out.String())
		}
		wantFits(t, out.String())
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"help", "demo"}, env(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, m := range allModes {
		if !strings.Contains(out.String(), "\n  "+m.legend()+"\n") {
			t.Errorf("help demo does not say what mode %s does:\n%s", m, out.String())
		}
	}
	var stderr bytes.Buffer
	if err := run(context.Background(), []string{"sell"}, env(nil), io.Discard, &stderr); err == nil || !strings.Contains(stderr.String(), "commands:") {
		t.Errorf("unknown command: err %v, stderr %q; want an error and the list of commands", err, stderr.String())
	}
	if err := run(context.Background(), []string{"help", "sell"}, env(nil), io.Discard, io.Discard); err == nil {
		t.Error("help of an unknown command succeeded")
	}
}

// TestServe_BindsLoopbackUnlessToldOtherwise: the default address is
// 127.0.0.1:8080; ADDR replaces it and -addr replaces ADDR; the banner
// names the address bound.
func TestServe_BindsLoopbackUnlessToldOtherwise(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"help", "serve"}, env(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `(default "127.0.0.1:8080")`) {
		t.Errorf("serve's default address is not 127.0.0.1:8080:\n%s", out.String())
	}
	out.Reset()
	if err := run(context.Background(), []string{"help", "serve"}, env(map[string]string{envAddr: "127.0.0.1:9999"}), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `(default "127.0.0.1:9999")`) {
		t.Errorf("ADDR does not set the default address:\n%s", out.String())
	}

	// ADDR alone picks the address (startServe passes -addr, so run here).
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, nil, env(map[string]string{envAddr: "127.0.0.1:0"}), pw, io.Discard)
		pw.Close()
	}()
	line, _ := readLine(pr)
	cancel()
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	if err := <-done; err != nil {
		t.Fatalf("serve with ADDR=127.0.0.1:0: %v", err)
	}
	if !strings.Contains(line, "listening on 127.0.0.1:") || strings.Contains(line, "127.0.0.1:0,") {
		t.Errorf("banner %q does not name the loopback port bound", line)
	}

	// -addr wins over ADDR.
	line, _ = startServe(t, map[string]string{envAddr: "192.0.2.1:1"})
	if !strings.Contains(line, "listening on 127.0.0.1:") {
		t.Errorf("banner %q: -addr 127.0.0.1:0 did not win over ADDR", line)
	}
	if got := boundAddr(&net.TCPAddr{IP: net.IPv6unspecified, Port: 8080}); got != "[::]:8080, every interface" {
		t.Errorf("boundAddr of the wildcard = %q", got)
	}
}

// readLine reads one line from r.
func readLine(r io.Reader) (string, error) {
	var b []byte
	one := make([]byte, 1)
	for {
		n, err := r.Read(one)
		if n == 1 {
			if one[0] == '\n' {
				return string(b), nil
			}
			b = append(b, one[0])
		}
		if err != nil {
			return string(b), err
		}
	}
}

// TestServe_BusyPortSaysHowToPickAnother: an address in use is refused
// with the flag and the variable that pick another.
func TestServe_BusyPortSaysHowToPickAnother(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	port := taken.Addr().(*net.TCPAddr).Port
	err = run(context.Background(), []string{"serve", "-addr", addr}, env(nil), io.Discard, io.Discard)
	next := "127.0.0.1:" + strconv.Itoa(port+1)
	for _, want := range []string{"in use", "-addr " + next, "ADDR=" + next, "port 0"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("serve on a busy port: err = %v, want it to say %q", err, want)
		}
	}
}

// TestService_HealthzAnswersHEADAndShortReasons: HEAD /healthz answers like
// GET without a body; a failing check names the backend, not the driver's
// error.
func TestService_HealthzAnswersHEADAndShortReasons(t *testing.T) {
	t.Parallel()
	_, url := startServe(t, nil)
	resp, err := http.Head(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("HEAD /healthz = %d, want 200", resp.StatusCode)
	}

	// A Redis nobody listens on: a port just freed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	rdb := redis.NewClient(&redis.Options{Addr: dead, MaxRetries: -1})
	defer rdb.Close()
	b := embedded(t)
	db, err := b.OpenDB()
	if err != nil {
		t.Fatal(err)
	}
	defer closeDB(db)
	svc, err := NewService(testConfig(t, ModeNone), rdb, db)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		rec := httptest.NewRecorder()
		svc.Handler().ServeHTTP(rec, httptest.NewRequest(method, "/healthz", nil))
		if rec.Code != http.StatusServiceUnavailable {
			t.Errorf("%s /healthz with Redis down = %d, want 503", method, rec.Code)
		}
		if method == http.MethodHead {
			continue
		}
		body := rec.Body.String()
		if !strings.Contains(body, `"detail":"redis unreachable"`) || strings.Contains(body, dead) || strings.Contains(body, "dial") {
			t.Errorf("GET /healthz with Redis down: %s; want the detail \"redis unreachable\" and no driver error", body)
		}
	}
}
