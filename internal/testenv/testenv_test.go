package testenv

import (
	"context"
	"database/sql"
	"testing"
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
