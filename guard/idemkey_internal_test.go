package guard

import (
	"errors"
	"strings"
	"testing"
)

func TestParseIdempotencyKey(t *testing.T) {
	good := map[string]string{
		`"abc"`:                                "abc",
		`  "a b"  `:                            "a b",
		`"q\"uote\\d"`:                         `q"uote\d`,
		"8e03978e-40d5-43e8-bc93-6894a57f9324": "8e03978e-40d5-43e8-bc93-6894a57f9324",
		"*tok:en/x":                            "*tok:en/x",
		`"` + strings.Repeat("k", 255) + `"`:   strings.Repeat("k", 255),
	}
	for in, want := range good {
		got, err := parseIdempotencyKey([]string{in})
		if err != nil || got != want {
			t.Errorf("parse(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	bad := []string{"", `""`, `"abc`, `"a\nb"`, "\"a\x01b\"", "\"a\x7fb\"", `"é"`, `"a";p=1`, `"a", "b"`, `a b`, "a\x00b", `a=b`,
		`"` + strings.Repeat("k", 256) + `"`, strings.Repeat("k", 256)}
	for _, in := range bad {
		if _, err := parseIdempotencyKey([]string{in}); !errors.Is(err, errIdemKey) {
			t.Errorf("parse(%q) = %v, want errIdemKey", in, err)
		}
	}
	if _, err := parseIdempotencyKey([]string{"a", "b"}); !errors.Is(err, errIdemKey) {
		t.Error("two header lines accepted")
	}
}

func FuzzParseIdempotencyKey(f *testing.F) {
	for _, s := range []string{`"abc"`, "uuid-1", `"a\"b"`, `"`, "", "\x00", `"a";b`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		key, err := parseIdempotencyKey([]string{in})
		if err != nil {
			if !errors.Is(err, errIdemKey) {
				t.Fatalf("error %v does not wrap errIdemKey", err)
			}
			return
		}
		if key == "" || len(key) > MaxIdempotencyKeyLen {
			t.Fatalf("accepted key of length %d", len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("accepted a key with byte %#x", key[i])
			}
		}
	})
}
