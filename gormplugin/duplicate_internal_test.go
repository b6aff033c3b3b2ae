package gormplugin

import (
	"errors"
	"testing"

	"github.com/go-sql-driver/mysql"
)

func TestDuplicateOf_ReadsMariaDBAndMySQL8Messages(t *testing.T) {
	for _, tc := range []struct {
		name, table, msg                string
		wantTable, wantIndex, wantValue string
	}{
		{"MariaDB", "orders", "Duplicate entry '7-sku-1' for key 'idx_user_sku'", "orders", "idx_user_sku", "7-sku-1"},
		{"MySQL 8", "orders", "Duplicate entry '7-sku-1' for key 'orders.idx_user_sku'", "orders", "idx_user_sku", "7-sku-1"},
		{"MySQL 8 raw SQL", "", "Duplicate entry 'k' for key 'orders.idx_idem_key'", "orders", "idx_idem_key", "k"},
		{"primary key", "orders", "Duplicate entry '42' for key 'PRIMARY'", "orders", "PRIMARY", "42"},
		{"quote in value", "orders", "Duplicate entry 'it's' for key 'idx_idem_key'", "orders", "idx_idem_key", "it's"},
		{"unknown shape", "orders", "Doppelter Eintrag", "orders", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := duplicateOf(tc.table, &mysql.MySQLError{Number: 1062, Message: tc.msg})
			var de *DuplicateError
			if !errors.As(err, &de) {
				t.Fatalf("err = %v, want *DuplicateError", err)
			}
			if de.Table != tc.wantTable || de.Index != tc.wantIndex || de.Value != tc.wantValue {
				t.Errorf("got %q %q %q, want %q %q %q", de.Table, de.Index, de.Value, tc.wantTable, tc.wantIndex, tc.wantValue)
			}
		})
	}
}

func TestDuplicateOf_LeavesOtherErrorsAlone(t *testing.T) {
	other := &mysql.MySQLError{Number: 1452, Message: "Cannot add or update a child row"}
	if err := duplicateOf("orders", other); err != other {
		t.Errorf("err = %v, want the driver error unchanged", err)
	}
	if err := duplicateOf("orders", nil); err != nil {
		t.Errorf("err = %v, want nil", err)
	}
}
