package testenv

import (
	"context"
	"database/sql"
	"testing"

	"github.com/go-sql-driver/mysql"
)

func TestRedis_StartsKillsAndRestartsEmpty(t *testing.T) {
	s := Redis(t)
	ctx := context.Background()
	c := s.Client()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Restart()
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("after restart: exists=%d err=%v; want an empty server", n, err)
	}
}

func TestMySQL_GivesEachTestItsOwnDatabase(t *testing.T) {
	a, b := MySQL(t), MySQL(t)
	if a == b {
		t.Fatal("two calls returned the same database")
	}
	db, err := sql.Open("mysql", a)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE t (id INT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
}

func TestMySQL_DropsADatabaseWithAnOpenTransaction(t *testing.T) {
	var dsn string
	t.Run("leaks a transaction", func(t *testing.T) {
		dsn = MySQL(t)
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		// Closed by nobody: the cleanup must still drop the database.
		if _, err := db.Exec("CREATE TABLE t (id INT PRIMARY KEY)"); err != nil {
			t.Fatal(err)
		}
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec("INSERT INTO t VALUES (1)"); err != nil {
			t.Fatal(err)
		}
	})
	admin, _ := admin()
	var n int
	if err := admin.QueryRow("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", dbName(dsn)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("database still there (%d, %v)", n, err)
	}
}

func dbName(dsn string) string {
	cfg, _ := mysql.ParseDSN(dsn)
	return cfg.DBName
}
