package testenv

import (
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// DefaultMySQLDSN is the server used when MYSQL_DSN is unset.
const DefaultMySQLDSN = "root@tcp(127.0.0.1:3306)/"

// dbPrefix names every database this package creates; the process id that
// follows it lets a later run drop what a killed run left behind.
const dbPrefix = "sgtest_"

var dbSeq atomic.Int64

// serverDSN returns the parsed MYSQL_DSN (or the default).
func serverDSN() (*mysql.Config, string, error) {
	raw := os.Getenv("MYSQL_DSN")
	if raw == "" {
		raw = DefaultMySQLDSN
	}
	cfg, err := mysql.ParseDSN(raw)
	if err != nil {
		return nil, raw, fmt.Errorf("testenv: MYSQL_DSN %q: %w", raw, err)
	}
	return cfg, raw, nil
}

var admin = sync.OnceValues(func() (*sql.DB, error) {
	cfg, raw, err := serverDSN()
	if err != nil {
		return nil, err
	}
	cfg = cfg.Clone()
	cfg.DBName = ""
	cfg.Timeout = 3 * time.Second
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err == nil {
		err = db.Ping()
	}
	if err != nil {
		return nil, fmt.Errorf("testenv: MariaDB/MySQL not reachable at %s (%v): start it (scripts/test does) or set MYSQL_DSN", raw, err)
	}
	db.SetMaxOpenConns(4)
	dropOrphans(db)
	return db, nil
})

// dropOrphans removes databases left by test processes that no longer run.
func dropOrphans(db *sql.DB) {
	rows, err := db.Query("SHOW DATABASES LIKE '" + dbPrefix + "%'")
	if err != nil {
		return
	}
	var names []string
	for rows.Next() {
		var n string
		if rows.Scan(&n) == nil {
			names = append(names, n)
		}
	}
	rows.Close()
	for _, n := range names {
		pidText, _, _ := strings.Cut(strings.TrimPrefix(n, dbPrefix), "_")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			drop(db, n)
		}
	}
}

// MySQL creates an empty database for t on the server named by MYSQL_DSN
// (default DefaultMySQLDSN), drops it when t ends, and returns a DSN for it
// with parseTime enabled.
func MySQL(t testing.TB) string {
	t.Helper()
	db, err := admin()
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("%s%d_%d", dbPrefix, os.Getpid(), dbSeq.Add(1))
	if _, err := db.Exec("CREATE DATABASE `" + name + "` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		t.Fatalf("testenv: create database %s: %v", name, err)
	}
	t.Cleanup(func() { drop(db, name) })
	cfg, _, _ := serverDSN()
	cfg = cfg.Clone()
	cfg.DBName = name
	cfg.ParseTime = true
	return cfg.FormatDSN()
}

// drop removes a test database. Connections still using it (a test that
// failed with a transaction open) are killed first, or DROP DATABASE would
// wait for their metadata locks until the test binary times out.
func drop(db *sql.DB, name string) {
	rows, err := db.Query("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ?", name)
	if err == nil {
		var ids []int64
		for rows.Next() {
			var id int64
			if rows.Scan(&id) == nil {
				ids = append(ids, id)
			}
		}
		rows.Close()
		for _, id := range ids {
			_, _ = db.Exec("KILL CONNECTION " + strconv.FormatInt(id, 10))
		}
	}
	_, _ = db.Exec("DROP DATABASE IF EXISTS `" + name + "`")
}
