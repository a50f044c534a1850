package pgversion

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
)

const (
	// Oldest is the oldest major version pgfence supports.
	Oldest = 14
	// Newest is the newest major version pgfence is tested on (make
	// test-versions).
	Newest = 18
)

// Version is a server's version, as server_version_num has it: 180004 for
// 18.4, 140023 for 14.23 (major times 10000 plus minor, from version 10 on).
type Version int

// Major is the major version: 18 for 18.4.
func (v Version) Major() int { return int(v) / 10000 }

// String names the version as Postgres's release notes do: "PostgreSQL
// 18.4".
func (v Version) String() string {
	if v < 100000 { // 9.6.24 is 90624
		return fmt.Sprintf("PostgreSQL %d.%d.%d", v/10000, v/100%100, v%100)
	}
	return fmt.Sprintf("PostgreSQL %d.%d", v.Major(), int(v)%10000)
}

// HasParameterPrivileges reports whether the server grants SET on
// parameters (GRANT SET ON PARAMETER, pg_parameter_acl): 15 on.
func (v Version) HasParameterPrivileges() bool { return v >= 150000 }

// HasMerge reports whether the server has MERGE: 15 on.
func (v Version) HasMerge() bool { return v >= 150000 }

// Untested reports whether the version is newer than any pgfence was
// tested on.
func (v Version) Untested() bool { return v.Major() > Newest }

// Querier is what Read needs of a connection (a *pgx.Conn or a pgx.Tx).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Read reads the server's version.
func Read(ctx context.Context, q Querier) (Version, error) {
	var s string
	if err := q.QueryRow(ctx, "SELECT pg_catalog.current_setting('server_version_num')").Scan(&s); err != nil {
		return 0, fmt.Errorf("reading the server's version (server_version_num): %w", err)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("reading the server's version: server_version_num is %q, not a number", s)
	}
	return Version(n), nil
}

// Unsupported is the error of a server older than Oldest.
type Unsupported struct {
	Version Version
}

func (e *Unsupported) Error() string {
	return fmt.Sprintf("the server runs %s (server_version_num %d), and pgfence supports PostgreSQL %d to %d: "+
		"its database backstop needs CREATE OR REPLACE TRIGGER and its primary check in_hot_standby, both new in PostgreSQL %d; "+
		"upgrade the server to PostgreSQL %d or later (PostgreSQL 13 reached its end of life in November 2025)",
		e.Version, int(e.Version), Oldest, Newest, Oldest, Oldest)
}

// Supported returns an *Unsupported error for a version older than Oldest,
// nil for any other.
func (v Version) Supported() error {
	if v.Major() < Oldest {
		return &Unsupported{Version: v}
	}
	return nil
}

// IsUnsupported reports whether err is, or wraps, an *Unsupported.
func IsUnsupported(err error) bool {
	var u *Unsupported
	return errors.As(err, &u)
}
