package gormplugin

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/seckillguard/seckillguard/fencing"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"
)

// ErrNotInstalled is returned for a write with a fencing token to a model
// with a Fence column on a *gorm.DB that has not installed the plugin: the
// model asks for fencing that nobody would enforce.
var ErrNotInstalled = errors.New("gormplugin: fence column written without the plugin (db.Use(gormplugin.New()))")

// Fence declares a model's fence column: the token of the newest lock holder
// that wrote the row. Declare it as a field,
//
//	Fence gormplugin.Fence
//
// which maps to a column "fence" BIGINT NOT NULL DEFAULT 0; the usual tags
// rename it (gorm:"column:lock_token") or override NOT NULL and DEFAULT. A
// model has at most one fence column; with several, the first one is used.
//
// With the plugin installed, every write whose context carries a token T
// (fencing.FromContext) is fenced:
//
//   - UPDATE (Save, Update, Updates with a map or a struct, UpdateColumn(s),
//     expressions such as gorm.Expr("stock - ?", 1)) gets "fence = T" in its
//     SET list and "fence <= T" in its WHERE clause, whatever Select or Omit
//     say about the column; a soft delete is such an UPDATE.
//   - DELETE gets "fence <= T" in its WHERE clause.
//   - INSERT (Create, batch Create) writes T into the column.
//   - INSERT ... ON DUPLICATE KEY UPDATE (Save of a slice, Save of a row that
//     the UPDATE did not find, Clauses(clause.OnConflict{...}).Create) changes
//     an existing row only if its fence is <= T, and then sets it to T. Its
//     affected-row count cannot tell a skipped row from an applied one, so
//     each fenced upsert that updates on conflict runs one SELECT afterwards;
//     it needs the primary key, or the clause.OnConflict Columns, among the
//     inserted values to find its rows (ErrUnsupported otherwise).
//
// A fenced write that a newer token has overtaken fails with a
// *fencing.StaleError (errors.Is(err, fencing.ErrStale)); see the package
// documentation for when exactly.
type Fence int64

// Token returns the fence as the token that last wrote the row.
func (f Fence) Token() fencing.Token { return fencing.Token(f) }

// CreateClauses declares the column and makes a token-carrying INSERT fail
// with ErrNotInstalled when the plugin is missing; GORM calls it once when it
// parses the model.
func (Fence) CreateClauses(f *schema.Field) []clause.Interface {
	return declare(f)
}

// UpdateClauses declares the column and makes a token-carrying UPDATE fail
// with ErrNotInstalled when the plugin is missing; GORM calls it once when it
// parses the model.
func (Fence) UpdateClauses(f *schema.Field) []clause.Interface {
	return declare(f)
}

// DeleteClauses declares the column and makes a token-carrying DELETE fail
// with ErrNotInstalled when the plugin is missing; GORM calls it once when it
// parses the model.
func (Fence) DeleteClauses(f *schema.Field) []clause.Interface {
	return declare(f)
}

// declare gives the field its column definition, NOT NULL DEFAULT 0, unless
// the model's tags say otherwise. A NULL fence would compare as unknown and
// make every fenced write skip the row.
func declare(f *schema.Field) []clause.Interface {
	_, notNull := f.TagSettings["NOT NULL"]
	_, notnull := f.TagSettings["NOTNULL"]
	if !notNull && !notnull {
		f.NotNull = true
	}
	if !f.HasDefaultValue {
		f.HasDefaultValue = true
		f.DefaultValue = "0"
		f.DefaultValueInterface = int64(0)
	}
	return []clause.Interface{installCheck{}}
}

// installCheck fails a token-carrying write to a fenced model when the
// plugin is not installed on the statement's database.
type installCheck struct{}

func (installCheck) Name() string               { return "" }
func (installCheck) Build(clause.Builder)       {}
func (installCheck) MergeClause(*clause.Clause) {}

func (installCheck) ModifyStatement(stmt *gorm.Statement) {
	if _, ok := stmt.DB.Plugins[pluginName]; ok {
		return
	}
	if _, ok := fencing.FromContext(stmt.Context); ok {
		stmt.AddError(fmt.Errorf("%w: writing %s", ErrNotInstalled, stmt.Table))
	}
}

var fenceType = reflect.TypeFor[Fence]()

// fenceField returns the fence column of a model, or nil.
func fenceField(s *schema.Schema) *schema.Field {
	if s == nil {
		return nil
	}
	for _, f := range s.Fields {
		if f.IndirectFieldType == fenceType && f.DBName != "" {
			return f
		}
	}
	return nil
}
