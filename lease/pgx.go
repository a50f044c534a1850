package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// DefaultSetting is the session setting pgfence reads the token from
// (pgfence serve --token-setting).
const DefaultSetting = "fence.token"

// Beginner starts a transaction: *pgx.Conn, *pgxpool.Pool and pgx.Tx (a
// savepoint) all are one.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

var (
	_ Beginner = (*pgx.Conn)(nil)
	_ Beginner = pgx.Tx(nil)
)

// Fencer applies fencing tokens to transactions.
type Fencer struct {
	// Setting is the setting pgfence reads the token from; "" means
	// DefaultSetting.
	Setting string
}

func (f Fencer) setting() string {
	if f.Setting == "" {
		return DefaultSetting
	}
	return f.Setting
}

// SetToken sets the token for the rest of tx only, with SET LOCAL: it is
// gone when tx ends, so a pooled connection never carries it into another
// transaction. (When tx is a savepoint, the setting lasts until the
// enclosing transaction ends, unless the savepoint is rolled back.) With
// DefaultSetting it sends SET LOCAL fence.token = <token>, which pgfence
// answers itself, so setting it costs no wait for Postgres; another
// setting goes through set_config, which takes any name as it is.
func (f Fencer) SetToken(ctx context.Context, tx pgx.Tx, token int64) error {
	var err error
	if name := f.setting(); name == DefaultSetting {
		_, err = tx.Exec(ctx, "SET LOCAL "+DefaultSetting+" = "+strconv.FormatInt(token, 10))
	} else {
		_, err = tx.Exec(ctx, "SELECT set_config($1, $2, true)", name, strconv.FormatInt(token, 10))
	}
	if err != nil {
		return fmt.Errorf("lease: setting %s: %w", f.setting(), err)
	}
	return nil
}

// WithToken runs fn in a transaction on db whose first statement sets the
// token (SetToken), and commits if fn returns nil; otherwise, or if ctx
// ends, it rolls back. fn gets ctx back, for its statements. fn writes plain SQL: through pgfence, a statement
// that finds rows a newer token has written changes none of them and
// reports 0 rows (tag.RowsAffected() == 0), which means: stop acting as
// the holder.
func (f Fencer) WithToken(ctx context.Context, db Beginner, token int64, fn func(ctx context.Context, tx pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) // a no-op after Commit
	if err := f.SetToken(ctx, tx, token); err != nil {
		return err
	}
	if err := fn(ctx, tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// WithLease is WithToken with l's token, for a holder that wants to stop
// writing as soon as it knows the lease is gone: it does not begin if l is
// no longer valid, it cancels the transaction when l is lost (the ctx fn
// gets ends with l: run fn's statements with it), and it rolls back rather
// than commit if l stopped being valid while fn ran. Its error then wraps
// ErrLost (or ErrReleased).
//
// This narrows the window; it cannot close it: a process paused right
// after the last check still commits late. That is what the token is for.
func (f Fencer) WithLease(ctx context.Context, db Beginner, l *Lease, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if err := l.Err(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(l.Context(), func() { cancel(l.Err()) })
	defer stop()
	err := f.WithToken(ctx, db, l.Token, func(ctx context.Context, tx pgx.Tx) error {
		if err := fn(ctx, tx); err != nil {
			return err
		}
		return l.Err() // do not commit on a lease that is gone
	})
	if lerr := l.Err(); err != nil && lerr != nil && !errors.Is(err, lerr) {
		return fmt.Errorf("%w (%v)", lerr, err)
	}
	return err
}

// WithToken is Fencer{}.WithToken: the token goes in fence.token.
func WithToken(ctx context.Context, db Beginner, token int64, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return Fencer{}.WithToken(ctx, db, token, fn)
}

// WithLease is Fencer{}.WithLease: the token goes in fence.token.
func WithLease(ctx context.Context, db Beginner, l *Lease, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return Fencer{}.WithLease(ctx, db, l, fn)
}
