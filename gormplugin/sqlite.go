package gormplugin

import (
	"errors"
	"fmt"
	"strings"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"
)

// SQLite support. Fencing itself is plain SQL and works unchanged; what
// differs from MySQL is the upsert syntax and the way a unique violation is
// reported: SQLite names the columns of the violated constraint ("UNIQUE
// constraint failed: orders.user_id, orders.sku") rather than the index, and
// never the value. The plugin recognises the driver's error by that message,
// so it works with any database/sql SQLite driver behind GORM's "sqlite"
// dialect (github.com/glebarez/sqlite, gorm.io/driver/sqlite) without
// importing one.

// dialectSQLite is the Name of GORM's SQLite dialects.
const dialectSQLite = "sqlite"

// supportedDialect reports whether the plugin knows the database's SQL.
func supportedDialect(name string) bool {
	return name == "mysql" || name == dialectSQLite
}

// duplicateIn turns a unique violation in err, reported by db's database,
// into a *DuplicateError and returns any other error unchanged.
func duplicateIn(db *gorm.DB, err error) error {
	if db.Dialector != nil && db.Dialector.Name() == dialectSQLite {
		return sqliteDuplicate(db, err)
	}
	return duplicateOf(db.Statement.Table, err)
}

// SQLite's extended result codes of a unique violation.
const (
	sqliteConstraintPrimaryKey = 1555 // SQLITE_CONSTRAINT_PRIMARYKEY
	sqliteConstraintUnique     = 2067 // SQLITE_CONSTRAINT_UNIQUE
)

const sqliteUniqueFailed = "UNIQUE constraint failed: "

// sqliteDuplicate turns SQLite's unique-violation error into a
// *DuplicateError naming the index: one of the model's unique indexes whose
// columns the message lists, "PRIMARY" for the primary key, and otherwise the
// index the database itself reports for those columns. Value stays empty:
// SQLite does not print it.
func sqliteDuplicate(db *gorm.DB, err error) error {
	if err == nil || errors.Is(err, ErrDuplicate) {
		return err
	}
	var coded interface{ Code() int }
	if errors.As(err, &coded) && coded.Code() != sqliteConstraintUnique && coded.Code() != sqliteConstraintPrimaryKey {
		return err
	}
	table, columns, index, ok := parseSQLiteUnique(err.Error())
	if !ok {
		return err
	}
	stmt := db.Statement
	if table == "" {
		table = stmt.Table
	}
	if index == "" {
		index = modelIndex(stmt.Schema, stmt.Table, table, columns)
	}
	if index == "" {
		index = sqliteIndex(db, table, columns)
	}
	if stmt.Table != "" {
		table = stmt.Table
	}
	return &DuplicateError{Table: table, Index: index, Err: err}
}

// parseSQLiteUnique reads "UNIQUE constraint failed: t.a, t.b" (the columns
// of the constraint, in its order) or, for an index on expressions, "UNIQUE
// constraint failed: index 'name'". Drivers may wrap the message and append
// the result code ("... (2067)").
func parseSQLiteUnique(msg string) (table string, columns []string, index string, ok bool) {
	i := strings.Index(msg, sqliteUniqueFailed)
	if i < 0 {
		return "", nil, "", false
	}
	body := msg[i+len(sqliteUniqueFailed):]
	if j := strings.LastIndex(body, " ("); j >= 0 && strings.HasSuffix(body, ")") {
		body = body[:j]
	}
	if name, found := strings.CutPrefix(body, "index '"); found {
		return "", nil, strings.TrimSuffix(name, "'"), true
	}
	for _, part := range strings.Split(body, ", ") {
		t, col, found := strings.Cut(part, ".")
		if !found || col == "" {
			return "", nil, "", false
		}
		if table == "" {
			table = t
		}
		columns = append(columns, col)
	}
	return table, columns, "", len(columns) > 0
}

// modelIndex returns the name of the model's unique index on exactly
// columns: "PRIMARY" for the primary key, the index's name, or, for a field
// tagged unique, its column (the name MySQL gives such a constraint). It
// returns "" when the model is unknown or names another table.
func modelIndex(s *schema.Schema, stmtTable, table string, columns []string) string {
	if s == nil || (stmtTable != "" && stmtTable != table) || (stmtTable == "" && s.Table != table) {
		return ""
	}
	if sameColumns(s.PrimaryFieldDBNames, columns) {
		return "PRIMARY"
	}
	for _, idx := range s.ParseIndexes() {
		if idx.Class != "UNIQUE" {
			continue
		}
		names := make([]string, 0, len(idx.Fields))
		for _, f := range idx.Fields {
			if f.Field == nil {
				names = nil
				break
			}
			names = append(names, f.DBName)
		}
		if names != nil && sameColumns(names, columns) {
			return idx.Name
		}
	}
	if len(columns) == 1 {
		if f := s.LookUpField(columns[0]); f != nil && f.Unique {
			return f.DBName
		}
	}
	return ""
}

// sqliteIndex asks the database which unique index of table covers exactly
// columns, for writes without a model (raw SQL, db.Table). It returns
// "PRIMARY" for the primary key, the column name for an unnamed UNIQUE
// column constraint, the index name otherwise, and "" when the lookup fails.
func sqliteIndex(db *gorm.DB, table string, columns []string) string {
	stmt := db.Statement
	if stmt.ConnPool == nil || table == "" {
		return ""
	}
	rows, err := stmt.ConnPool.QueryContext(stmt.Context, "SELECT name, origin FROM pragma_index_list(?) WHERE \"unique\" = 1", table)
	if err != nil {
		return ""
	}
	type candidate struct{ name, origin string }
	var candidates []candidate
	for rows.Next() {
		var c candidate
		if rows.Scan(&c.name, &c.origin) == nil {
			candidates = append(candidates, c)
		}
	}
	rows.Close()
	for _, c := range candidates {
		cols, err := sqliteIndexColumns(db, c.name)
		if err != nil || !sameColumns(cols, columns) {
			continue
		}
		switch {
		case c.origin == "pk":
			return "PRIMARY"
		case c.origin == "u" && len(cols) == 1:
			return cols[0]
		}
		return c.name
	}
	return ""
}

func sqliteIndexColumns(db *gorm.DB, index string) ([]string, error) {
	stmt := db.Statement
	rows, err := stmt.ConnPool.QueryContext(stmt.Context, "SELECT name FROM pragma_index_info(?) ORDER BY seqno", index)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var cols []string
	for rows.Next() {
		var name *string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		if name == nil { // an expression
			return nil, fmt.Errorf("index %s has expressions", index)
		}
		cols = append(cols, *name)
	}
	return cols, rows.Err()
}

func sameColumns(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// guardUpsertSQLite fences INSERT ... ON CONFLICT DO UPDATE on SQLite: the
// update gets "WHERE fence <= token" (SQLite skips a conflicting row the
// condition rejects, as if DO NOTHING) and "fence = token" in its SET list.
// Like on MySQL, the affected-row count cannot tell a skipped row from an
// applied one, so verify looks the rows up afterwards.
func guardUpsertSQLite(stmt *gorm.Statement, w *write, c clause.Clause) clause.Clause {
	oc, ok := c.Expression.(clause.OnConflict)
	if !ok || oc.DoNothing || len(oc.DoUpdates) == 0 {
		return c // nothing existing is changed
	}
	targets := upsertTargetsOf(stmt, oc)
	if targets == nil {
		stmt.AddError(fmt.Errorf("%w: an upsert of %s needs its primary key or clause.OnConflict Columns among the inserted values to check its fence", ErrUnsupported, stmt.Table))
		return c
	}
	w.upsert = targets
	set := make(clause.Set, 0, len(oc.DoUpdates)+1)
	for _, a := range oc.DoUpdates {
		if !isColumn(a.Column, w.field.DBName) {
			set = append(set, a)
		}
	}
	oc.DoUpdates = append(set, clause.Assignment{Column: clause.Column{Name: w.field.DBName}, Value: int64(w.token)})
	oc.Where.Exprs = append(oc.Where.Exprs[:len(oc.Where.Exprs):len(oc.Where.Exprs)],
		fenceCondition{column: w.field.DBName, token: int64(w.token)})
	c.Expression = oc
	return c
}
