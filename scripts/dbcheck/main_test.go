package main

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// TestCheck_TellsARefusedLoginFromAServerThatIsDown runs against the
// tests' own MariaDB: its login is accepted, an unknown user is refused,
// and a port nobody listens on is down.
func TestCheck_TellsARefusedLoginFromAServerThatIsDown(t *testing.T) {
	dsn := testenv.MySQL(t) // the server of the tests answers, or the test fails here
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if status, msg := check(ctx, dsn); status != statusOK {
		t.Fatalf("the tests' server: status %d, %s", status, msg)
	}
	status, msg := check(ctx, "seckillguard_nobody:wrong@tcp("+cfg.Addr+")/")
	if status != statusRefused || !strings.Contains(msg, "refuses user") {
		t.Errorf("an unknown user: status %d, %q; want %d and a refused login", status, msg, statusRefused)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := ln.Addr().String()
	ln.Close()
	status, msg = check(ctx, "root@tcp("+free+")/")
	if status != statusDown || !strings.Contains(msg, "nothing answers") {
		t.Errorf("a port nobody listens on: status %d, %q; want %d and a server that is down", status, msg, statusDown)
	}
}
