// Command dbcheck tells scripts/test whether the database server of the
// tests accepts them: the server of MYSQL_DSN, or root without a password
// on 127.0.0.1:3306 (the default of internal/testkit/testenv). It logs in with the
// same driver as the tests, without selecting a database.
//
// Exit status: 0 the server accepts the login; 2 nothing answers at the
// address (the server is down); 3 the server answers but refuses the
// login; 1 anything else. One line on stderr says which.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/go-sql-driver/mysql"
)

// defaultDSN is the server the tests use when MYSQL_DSN is unset.
const defaultDSN = "root@tcp(127.0.0.1:3306)/"

// The outcomes of a check, as exit statuses.
const (
	statusOK      = 0
	statusOther   = 1
	statusDown    = 2
	statusRefused = 3
)

func main() {
	raw := os.Getenv("MYSQL_DSN")
	if raw == "" {
		raw = defaultDSN
	}
	status, msg := check(context.Background(), raw)
	if status != statusOK {
		fmt.Fprintln(os.Stderr, "dbcheck:", msg)
	}
	os.Exit(status)
}

// check logs in to the server of dsn and names the outcome.
func check(ctx context.Context, dsn string) (int, string) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return statusOther, fmt.Sprintf("MYSQL_DSN %q does not parse: %v", dsn, err)
	}
	cfg = cfg.Clone()
	cfg.DBName = ""
	cfg.Timeout = 3 * time.Second
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return statusOther, err.Error()
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = db.PingContext(ctx)
	var myErr *mysql.MySQLError
	var netErr *net.OpError
	switch {
	case err == nil:
		return statusOK, ""
	case errors.As(err, &myErr) && (myErr.Number == 1045 || myErr.Number == 1698):
		hint := ""
		if cfg.User == "root" && cfg.Passwd == "" {
			hint = " (Debian's MariaDB lets root in through the unix socket only; to allow it over TCP too:" +
				" ALTER USER root@localhost IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD(''))"
		}
		return statusRefused, fmt.Sprintf("the server at %s is up but refuses user %q (%v): set MYSQL_DSN to an account "+
			"that may create databases, such as 'user:password@tcp(%s)/'%s", cfg.Addr, cfg.User, myErr, cfg.Addr, hint)
	case errors.As(err, &netErr) && netErr.Op == "dial":
		return statusDown, fmt.Sprintf("nothing answers at %s (%v): the server is down or listens elsewhere", cfg.Addr, netErr.Err)
	}
	return statusOther, fmt.Sprintf("the server at %s: %v", cfg.Addr, err)
}
