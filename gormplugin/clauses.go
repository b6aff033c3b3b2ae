package gormplugin

import (
	"fmt"
	"reflect"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// The fence is added while GORM builds the statement's SQL, through clause
// builders, because that is the first moment the statement is complete: GORM
// derives the SET list and the primary-key conditions of an UPDATE, and the
// primary-key conditions of a DELETE, inside its own callbacks, after every
// plugin callback that runs before them. A builder sees the final clauses
// whatever API produced them (Save, Update, Updates, UpdateColumn, soft
// delete, Select/Omit, Clauses(clause.Set{...})).
//
// The builders of the dialect (MySQL's VALUES and ON CONFLICT) still run;
// the plugin only hands them rewritten clauses. Statements that are not
// fenced reach them untouched.

// installClauseBuilders wraps db's clause builders for the fenced clauses.
func installClauseBuilders(db *gorm.DB) {
	if db.ClauseBuilders == nil {
		db.ClauseBuilders = map[string]clause.ClauseBuilder{}
	}
	wrap := func(name string, rewrite func(*gorm.Statement, *write, clause.Clause) clause.Clause) {
		next := db.ClauseBuilders[name]
		db.ClauseBuilders[name] = func(c clause.Clause, b clause.Builder) {
			if stmt, ok := b.(*gorm.Statement); ok {
				if w := writeOf(stmt); w != nil {
					c = rewrite(stmt, w, c)
				}
			}
			if next != nil {
				next(c, b)
			} else {
				c.Build(b)
			}
		}
	}
	// UPDATE is built before SET and WHERE, so changing those clauses
	// while it is built changes the SQL that follows.
	wrap("UPDATE", func(stmt *gorm.Statement, w *write, c clause.Clause) clause.Clause {
		fenceSet(stmt, w)
		fenceWhere(stmt, w)
		return c
	})
	wrap("DELETE", func(stmt *gorm.Statement, w *write, c clause.Clause) clause.Clause {
		fenceWhere(stmt, w)
		return c
	})
	wrap("VALUES", fenceValues)
	wrap("ON CONFLICT", guardUpsert)
}

// fenceSet makes the statement's SET list end with "fence = token", dropping
// any other assignment to the fence column.
func fenceSet(stmt *gorm.Statement, w *write) {
	c, ok := stmt.Clauses["SET"]
	if !ok {
		return
	}
	var set []clause.Assignment
	switch e := c.Expression.(type) {
	case clause.Set:
		set = e
	case clause.Assigner:
		set = e.Assignments()
	default:
		stmt.AddError(fmt.Errorf("%w: SET clause %T", ErrUnsupported, c.Expression))
		return
	}
	fenced := make(clause.Set, 0, len(set)+1)
	for _, a := range set {
		if !isColumn(a.Column, w.field.DBName) {
			fenced = append(fenced, a)
		}
	}
	fenced = append(fenced, clause.Assignment{Column: clause.Column{Name: w.field.DBName}, Value: int64(w.token)})
	c.Expression = fenced
	stmt.Clauses["SET"] = c
}

func isColumn(c clause.Column, name string) bool {
	return c.Name == name && !c.Raw
}

// fenceCondition is "fence <= token" in a WHERE clause. Its own type lets the
// check SELECT find and drop it.
type fenceCondition struct {
	column string
	token  int64
}

func (f fenceCondition) Build(b clause.Builder) {
	b.WriteQuoted(clause.Column{Table: clause.CurrentTable, Name: f.column})
	b.WriteString(" <= ")
	b.AddVar(b, f.token)
}

// fenceWhere adds "AND fence <= token" to the statement's WHERE clause.
func fenceWhere(stmt *gorm.Statement, w *write) {
	c, hasWhere := stmt.Clauses["WHERE"]
	where, _ := c.Expression.(clause.Where)
	for _, e := range where.Exprs {
		if _, done := e.(fenceCondition); done {
			return
		}
	}
	if !stmt.DB.AllowGlobalUpdate && !hasConditions(stmt, hasWhere, where) {
		// GORM refuses this statement (ErrMissingWhereClause) after it is
		// built; the fence condition must not make it look conditional.
		return
	}
	exprs := where.Exprs
	for _, e := range exprs {
		if _, isOr := e.(clause.OrConditions); isOr {
			// "a OR b AND fence <= t" would fence only b.
			exprs = []clause.Expression{clause.And(exprs...)}
			break
		}
	}
	exprs = append(exprs[:len(exprs):len(exprs)], fenceCondition{column: w.field.DBName, token: int64(w.token)})
	c.Name = "WHERE"
	c.Expression = clause.Where{Exprs: exprs}
	stmt.Clauses["WHERE"] = c
}

// hasConditions mirrors GORM's own test for an UPDATE or DELETE without
// conditions: no WHERE clause, or only the soft-delete condition.
func hasConditions(stmt *gorm.Statement, hasWhere bool, where clause.Where) bool {
	if !hasWhere {
		return false
	}
	if _, softDelete := stmt.Clauses["soft_delete_enabled"]; softDelete {
		return len(where.Exprs) > 1
	}
	return true
}

// conditionsWithoutFence returns the statement's WHERE conditions without
// the fence condition.
func conditionsWithoutFence(stmt *gorm.Statement) []clause.Expression {
	where, _ := stmt.Clauses["WHERE"].Expression.(clause.Where)
	conds := make([]clause.Expression, 0, len(where.Exprs))
	for _, e := range where.Exprs {
		if _, isFence := e.(fenceCondition); !isFence {
			conds = append(conds, e)
		}
	}
	return conds
}

// fenceValues writes the token into the fence column of every inserted row,
// adding the column when Select or Omit left it out.
func fenceValues(stmt *gorm.Statement, w *write, c clause.Clause) clause.Clause {
	values, ok := c.Expression.(clause.Values)
	if !ok || len(values.Values) == 0 {
		return c
	}
	idx := -1
	for i, col := range values.Columns {
		if isColumn(col, w.field.DBName) {
			idx = i
		}
	}
	columns := values.Columns
	if idx < 0 {
		columns = append(columns[:len(columns):len(columns)], clause.Column{Name: w.field.DBName})
	}
	rows := make([][]any, len(values.Values))
	for i, row := range values.Values {
		r := make([]any, len(row), len(columns))
		copy(r, row)
		if idx < 0 {
			r = append(r, int64(w.token))
		} else {
			r[idx] = int64(w.token)
		}
		rows[i] = r
	}
	c.Expression = clause.Values{Columns: columns, Values: rows}
	return c
}

// guardUpsert fences the assignments of INSERT ... ON DUPLICATE KEY UPDATE:
// each becomes "col = IF(fence <= token, new, col)", and "fence =
// GREATEST(fence, token)" comes last, because MySQL evaluates the assignments
// in order and the conditions must see the fence the row had before.
func guardUpsert(stmt *gorm.Statement, w *write, c clause.Clause) clause.Clause {
	if stmt.Dialector.Name() == dialectSQLite {
		return guardUpsertSQLite(stmt, w, c)
	}
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

	fence := clause.Column{Name: w.field.DBName}
	guarded := make([]clause.Assignment, 0, len(oc.DoUpdates)+1)
	for _, a := range oc.DoUpdates {
		if isColumn(a.Column, w.field.DBName) {
			continue
		}
		value := a.Value
		if col, ok := value.(clause.Column); ok && col.Table == "excluded" {
			value = clause.Expr{SQL: "VALUES(?)", Vars: []any{clause.Column{Name: col.Name}}}
		}
		guarded = append(guarded, clause.Assignment{
			Column: a.Column,
			Value: clause.Expr{
				SQL:  "IF(? <= ?, ?, ?)",
				Vars: []any{fence, int64(w.token), value, clause.Column{Name: a.Column.Name}},
			},
		})
	}
	guarded = append(guarded, clause.Assignment{
		Column: fence,
		Value:  clause.Expr{SQL: "GREATEST(?, ?)", Vars: []any{fence, int64(w.token)}},
	})
	oc.DoUpdates = guarded
	c.Expression = oc
	return c
}

// upsertTargets identifies the rows an upsert may have changed: key columns
// and one tuple of values per inserted row.
type upsertTargets struct {
	columns []string
	values  [][]any
}

// upsertTargetsOf returns the rows of the statement's VALUES identified by
// the primary key (non-zero in every row) or, failing that, by the
// OnConflict columns; nil when neither is among the inserted columns.
func upsertTargetsOf(stmt *gorm.Statement, oc clause.OnConflict) *upsertTargets {
	values, ok := stmt.Clauses["VALUES"].Expression.(clause.Values)
	if !ok {
		return nil
	}
	if stmt.Schema != nil && len(stmt.Schema.PrimaryFieldDBNames) > 0 {
		if t := targetsBy(values, stmt.Schema.PrimaryFieldDBNames, true); t != nil {
			return t
		}
	}
	if len(oc.Columns) > 0 {
		names := make([]string, len(oc.Columns))
		for i, col := range oc.Columns {
			names[i] = col.Name
		}
		return targetsBy(values, names, false)
	}
	return nil
}

// targetsBy returns the values of the named columns in every row, or nil
// when a column is missing (or, with nonZero, zero in some row).
func targetsBy(values clause.Values, names []string, nonZero bool) *upsertTargets {
	idx := make([]int, len(names))
	for i, name := range names {
		idx[i] = -1
		for j, col := range values.Columns {
			if isColumn(col, name) {
				idx[i] = j
			}
		}
		if idx[i] < 0 {
			return nil
		}
	}
	t := &upsertTargets{columns: names, values: make([][]any, len(values.Values))}
	for r, row := range values.Values {
		key := make([]any, len(idx))
		for i, j := range idx {
			if j >= len(row) || (nonZero && (row[j] == nil || reflect.ValueOf(row[j]).IsZero())) {
				return nil
			}
			key[i] = row[j]
		}
		t.values[r] = key
	}
	return t
}
