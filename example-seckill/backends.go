package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"

	"github.com/alicebob/miniredis/v2"
	"github.com/glebarez/sqlite"
	gomysql "github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/seckillguard/seckillguard/gormplugin"
)

// Backends are the Redis and the database that every instance of a run
// shares. Each instance opens its own client and pool on them, as separate
// processes would.
type Backends struct {
	Redis    string // one line naming the Redis
	Database string // one line naming the database

	redisOpts *redis.Options
	dialector func() gorm.Dialector
	sqlite    bool
	quiet     bool // the MySQL driver logs nothing (Quiet)

	mini   *miniredis.Miniredis // embedded Redis, nil with REDIS_URL
	keeper *sql.DB              // holds the in-memory SQLite database open
}

// Environment variables that select real servers.
const (
	envRedisURL = "REDIS_URL" // redis://[:password@]host:port[/db]
	envMySQLDSN = "MYSQL_DSN" // user:password@tcp(host:3306)/dbname
)

var memdbSeq atomic.Int64

// OpenBackends connects to the servers named by REDIS_URL and MYSQL_DSN
// (read through getenv), and embeds what is not named: miniredis in this
// process instead of Redis, and SQLite (pure Go) instead of MySQL, in memory
// unless sqlitePath names a file.
func OpenBackends(getenv func(string) string, sqlitePath string) (*Backends, error) {
	b := &Backends{}
	if raw := getenv(envRedisURL); raw != "" {
		opts, err := redis.ParseURL(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", envRedisURL, err)
		}
		b.redisOpts = opts
		b.Redis = fmt.Sprintf("%s db %d (%s)", opts.Addr, opts.DB, envRedisURL)
	} else {
		m := miniredis.NewMiniRedis()
		// Real Redis expires keys as time passes; miniredis only when told.
		// Lock leases must run out by themselves, so its TTLs follow the clock.
		m.ClockTTL(true)
		if err := m.Start(); err != nil {
			return nil, fmt.Errorf("start the embedded Redis: %w", err)
		}
		b.mini = m
		b.redisOpts = &redis.Options{Addr: m.Addr()}
		b.Redis = "embedded miniredis (in process, " + m.Addr() + ")"
	}

	if raw := getenv(envMySQLDSN); raw != "" {
		cfg, err := gomysql.ParseDSN(raw)
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("%s: %w", envMySQLDSN, err)
		}
		if cfg.DBName == "" {
			b.Close()
			return nil, fmt.Errorf("%s %q names no database: add one, as in user:password@tcp(127.0.0.1:3306)/shop", envMySQLDSN, raw)
		}
		cfg.ParseTime = true
		// Count the rows an UPDATE matches, not the rows it changes: the
		// fencing plugin then needs no check query for a write that
		// repeats the stored values.
		cfg.ClientFoundRows = true
		// Send statements with their arguments in one round trip instead of
		// preparing, executing and closing each (a fifth of the service's
		// CPU and a round trip per write otherwise).
		cfg.InterpolateParams = true
		b.dialector = func() gorm.Dialector {
			c := cfg.Clone()
			if b.quiet {
				// A query cut short by a lost lock closes its connection,
				// and the driver says so on stderr.
				c.Logger = &gomysql.NopLogger{}
			}
			connector, err := gomysql.NewConnector(c)
			if err != nil {
				return mysql.New(mysql.Config{DSNConfig: c})
			}
			return mysql.New(mysql.Config{Conn: sql.OpenDB(connector), DSNConfig: c})
		}
		b.Database = fmt.Sprintf("MySQL %s@%s/%s (%s)", cfg.User, cfg.Addr, cfg.DBName, envMySQLDSN)
		return b, nil
	}

	// SQLite takes one writer at a time: transactions take the write lock
	// when they begin (immediate) and wait for it up to busy_timeout.
	const params = "_pragma=busy_timeout(10000)&_txlock=immediate"
	var dsn string
	if sqlitePath != "" {
		dsn = sqlitePath + "?" + params + "&_pragma=journal_mode(WAL)"
		b.Database = "embedded SQLite file " + sqlitePath + " (pure Go)"
	} else {
		// The memdb VFS shares one in-memory database among all the
		// connections of this process that name it.
		dsn = fmt.Sprintf("file:/seckill-%d?vfs=memdb&%s", memdbSeq.Add(1), params)
		b.Database = "embedded SQLite in memory (pure Go; gone when the process exits)"
	}
	b.sqlite = true
	b.dialector = func() gorm.Dialector { return sqlite.Open(dsn) }
	if sqlitePath == "" {
		keeper, err := sql.Open("sqlite", dsn)
		if err == nil {
			err = keeper.Ping()
		}
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("open the embedded SQLite: %w", err)
		}
		keeper.SetMaxIdleConns(1)
		keeper.SetConnMaxIdleTime(0)
		b.keeper = keeper
	}
	return b, nil
}

// NewRedis returns a new client of the shared Redis.
func (b *Backends) NewRedis() *redis.Client {
	opts := *b.redisOpts
	return redis.NewClient(&opts)
}

// OpenDB returns a new pool on the shared database, with the fencing plugin
// installed.
func (b *Backends) OpenDB() (*gorm.DB, error) {
	db, err := gorm.Open(b.dialector(), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, fmt.Errorf("open the database: %w", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	// As many idle connections as open ones: a pool that may open more
	// than it keeps closes and redials a connection per query under load.
	conns := 32
	if b.sqlite {
		conns = 8
	}
	sqlDB.SetMaxOpenConns(conns)
	sqlDB.SetMaxIdleConns(conns)
	if err := db.Use(gormplugin.New()); err != nil {
		_ = sqlDB.Close()
		return nil, err
	}
	return db, nil
}

// Quiet keeps the database driver from logging to stderr in the pools
// opened from now on.
func (b *Backends) Quiet() { b.quiet = true }

// Embedded reports whether the Redis and the database run in this process.
func (b *Backends) Embedded() (redis, database bool) { return b.mini != nil, b.sqlite }

// Close stops what the Backends embed.
func (b *Backends) Close() {
	if b.keeper != nil {
		_ = b.keeper.Close()
	}
	if b.mini != nil {
		b.mini.Close()
	}
}

// closeDB closes a pool opened by OpenDB.
func closeDB(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		_ = sqlDB.Close()
	}
}

// ping checks that both servers answer.
func ping(ctx context.Context, rdb redis.UniversalClient, db *gorm.DB) error {
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("%w: %w", errRedisDown, err)
	}
	sqlDB, err := db.DB()
	if err == nil {
		err = sqlDB.PingContext(ctx)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", errDatabaseDown, err)
	}
	return nil
}

// What ping reports first, before the driver's error.
var (
	errRedisDown    = errors.New("redis unreachable")
	errDatabaseDown = errors.New("database unreachable")
)

// hostPort formats an address for a URL.
func hostPort(addr net.Addr) string {
	s := addr.String()
	if strings.HasPrefix(s, "[::]:") {
		return "localhost:" + strings.TrimPrefix(s, "[::]:")
	}
	if strings.HasPrefix(s, "0.0.0.0:") {
		return "localhost:" + strings.TrimPrefix(s, "0.0.0.0:")
	}
	return s
}
