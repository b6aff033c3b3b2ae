package gormplugin

import (
	"reflect"
	"testing"
)

func TestParseSQLiteUnique_ReadsTheDriversMessages(t *testing.T) {
	for _, tc := range []struct {
		name, msg string
		table     string
		columns   []string
		index     string
		ok        bool
	}{
		{"glebarez", "constraint failed: UNIQUE constraint failed: orders.user_id, orders.sku (2067)", "orders", []string{"user_id", "sku"}, "", true},
		{"mattn", "UNIQUE constraint failed: orders.idempotency_key", "orders", []string{"idempotency_key"}, "", true},
		{"expression index", "constraint failed: UNIQUE constraint failed: index 'idx_lower_email' (2067)", "", nil, "idx_lower_email", true},
		{"not unique", "constraint failed: NOT NULL constraint failed: orders.sku (1299)", "", nil, "", false},
		{"unknown shape", "UNIQUE constraint failed: something", "", nil, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table, columns, index, ok := parseSQLiteUnique(tc.msg)
			if table != tc.table || !reflect.DeepEqual(columns, tc.columns) || index != tc.index || ok != tc.ok {
				t.Errorf("got %q %q %q %v, want %q %q %q %v", table, columns, index, ok, tc.table, tc.columns, tc.index, tc.ok)
			}
		})
	}
}
