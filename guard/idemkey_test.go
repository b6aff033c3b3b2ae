package guard_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

func TestIdempotent_InvalidKeyNamesTheCharacterNotItsFirstByte(t *testing.T) {
	srv := testenv.Redis(t)
	var p payments
	in := idemInstance(t, srv, p.pay)
	r := do(t, "POST", in.srv.URL+"/pay", `{}`, "Idempotency-Key", "ééé", "X-User-ID", "u1")
	var v struct{ Error, Detail string }
	_ = json.Unmarshal(r.body, &v)
	if r.status != 400 || v.Error != "idempotency_key_invalid" {
		t.Fatalf("answer %d %s, want 400 idempotency_key_invalid", r.status, r.body)
	}
	if !strings.Contains(v.Detail, `'é'`) || strings.Contains(v.Detail, "Ã") {
		t.Fatalf("detail %q does not name the character 'é'", v.Detail)
	}
	// A byte that starts no UTF-8 sequence is named in hex.
	r = do(t, "POST", in.srv.URL+"/pay", `{}`, "Idempotency-Key", "ab\xffc", "X-User-ID", "u1")
	_ = json.Unmarshal(r.body, &v)
	if r.status != 400 || !strings.Contains(v.Detail, "byte 0xff") {
		t.Fatalf("answer %d %s, want 400 naming byte 0xff", r.status, r.body)
	}
	if p.runs.Load() != 0 {
		t.Fatal("the handler ran")
	}
}
