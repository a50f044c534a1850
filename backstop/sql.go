package backstop

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/sqlrewrite"
)

// Schema holds pgfence's objects in the database.
const Schema = "pgfence"

// Names of the triggers on a guarded table. BEFORE triggers fire in name
// order: "~" sorts after letters and digits, so the row trigger fires last
// and sees the row as the other BEFORE triggers leave it.
const (
	RowTrigger      = "~pgfence_backstop"
	TruncateTrigger = "~pgfence_backstop_truncate"
)

// SQLSTATEs the backstop raises besides Postgres's and the rewriter's own.
const (
	// CodeStaleCascade: a stale row written by another trigger (a
	// foreign-key cascade), which cannot be skipped without leaving the
	// write that caused it half done.
	CodeStaleCascade = "PF002"
	// CodeStaleNotice is the code of the notice a skipped stale write
	// raises, once per statement and table, so that pgfence counts the
	// rejects of its own sessions; a client connected straight to Postgres
	// sees it as a NOTICE.
	CodeStaleNotice = "PF010"
)

// NoticeMark is the mark a notice of CodeStaleNotice carries (mark= in
// its detail) when the backstop raised it: the MD5, in hex, of pgfence's
// secret (pgfence.secret, which only pgfence's role reads), the
// statement's time in microseconds since 1970 (at=), the table's oid
// (rel=) and the kind of reject (kind=), separated by spaces. A client
// can raise a notice of that code, but not with a mark that holds.
func NoticeMark(key, at, rel, kind string) string {
	sum := md5.Sum([]byte(key + " " + at + " " + rel + " " + kind))
	return hex.EncodeToString(sum[:])
}

// ReadNoticeKey reads pgfence's secret, with which NoticeMark marks
// notices: "" when pgfence's schema is not set up; an error when the role
// may not read it.
func ReadNoticeKey(ctx context.Context, conn *pgx.Conn) (string, error) {
	// Two queries: a text naming pgfence.secret fails before Setup,
	// whatever its CASE says.
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.to_regclass('pgfence.secret') IS NOT NULL").Scan(&exists); err != nil || !exists {
		return "", err
	}
	var key string
	if err := conn.QueryRow(ctx, "SELECT key FROM pgfence.secret").Scan(&key); err != nil && err != pgx.ErrNoRows {
		return "", fmt.Errorf("reading pgfence's secret (only pgfence's own role may): %w", err)
	}
	return key, nil
}

// Options are what every guarded table's backstop shares.
type Options struct {
	// TokenSetting is the session setting that holds the token
	// (default "fence.token").
	TokenSetting string
	// AllowTruncate lets TRUNCATE of guarded tables through.
	AllowTruncate bool
	// ExemptRoles may write guarded tables without the fence (migrations):
	// the trigger lets their writes through as they are, and counts them.
	ExemptRoles []string
	// PooledRoles are the login roles that reach Postgres only through
	// pgfence behind a transaction pooler: their sessions' token counts
	// only in the transaction pgfence set it in (its marker holds that
	// transaction's stamp, see sqlrewrite.PooledStamp). A token a client
	// left on a pooled server connection, where pgfence cannot see (in a
	// function), would otherwise fence the next client's writes that
	// pgfence did not see as writes, with the wrong lease's token.
	PooledRoles []string
	// Discovered, when discovery is on, is the configuration a table that
	// has the discovered epoch column gets (its Column; no Schema or
	// Table): Install then keeps an event trigger that puts the backstop
	// on such a table as DDL creates it (see EventTrigger).
	Discovered *sqlrewrite.Guard
	// Replace records this configuration in the database in place of the
	// one recorded there ('pgfence init'). Without it the recorded one is
	// what Install keeps, and where this one differs Reconcile says so
	// (Report.Differences): see record.go.
	Replace bool
}

func (o Options) setting() string {
	if o.TokenSetting == "" {
		return "fence.token"
	}
	return o.TokenSetting
}

// Function is a trigger function: its name in Schema and the body
// (prosrc) its name was made from.
type Function struct {
	Name string
	Body string
}

// DDL creates or replaces the function.
func (f Function) DDL() string {
	return "CREATE OR REPLACE FUNCTION " + ident(Schema) + "." + ident(f.Name) +
		"() RETURNS trigger LANGUAGE plpgsql AS " + dollarQuote(f.Body)
}

// named names a body after its hash: equal configurations share a
// function, and a function edited by hand no longer matches its name.
func named(prefix, body string) Function {
	sum := sha256.Sum256([]byte(body))
	return Function{Name: prefix + hex.EncodeToString(sum[:8]), Body: body}
}

// RowFunction is the row trigger function enforcing g's rule, or false for
// a guard that gets no backstop (Observe).
func RowFunction(g sqlrewrite.Guard, o Options) (Function, bool) {
	if g.Rollout == sqlrewrite.Observe {
		return Function{}, false
	}
	return named("backstop_", rowBody(g, o)), true
}

// TruncateFunction is the TRUNCATE trigger function, or false when
// TRUNCATE is allowed.
func TruncateFunction(o Options) (Function, bool) {
	if o.AllowTruncate {
		return Function{}, false
	}
	var b strings.Builder
	b.WriteString("\nBEGIN\n")
	exempt(&b, o, "NULL")
	fmt.Fprintf(&b, `  RAISE EXCEPTION USING ERRCODE = '0A000',
    MESSAGE = pg_catalog.format('pgfence: TRUNCATE of guarded table %%I.%%I is refused: it would remove rows whatever their fencing epoch', TG_TABLE_SCHEMA, TG_TABLE_NAME),
    HINT = 'delete the rows with a fenced DELETE, write as a role pgfence exempts (--backstop-exempt-role), or start pgfence with --allow-truncate';
END
`)
	return named("backstop_truncate_", b.String()), true
}

// roleArray is roles as a name[] literal, sorted.
func roleArray(roles []string) string {
	roles = slices.Sorted(slices.Values(roles))
	quoted := make([]string, len(roles))
	for i, r := range roles {
		quoted[i] = literal(r)
	}
	return "ARRAY[" + strings.Join(quoted, ", ") + "]::pg_catalog.name[]"
}

// exempt writes the test that lets exempt roles through, returning ret.
func exempt(b *strings.Builder, o Options, ret string) {
	if len(o.ExemptRoles) == 0 {
		return
	}
	fmt.Fprintf(b, "  IF CURRENT_USER OPERATOR(pg_catalog.=) ANY (%s) THEN\n", roleArray(o.ExemptRoles))
	b.WriteString("    PERFORM pgfence.note_exempt(TG_RELID, CURRENT_USER);\n")
	if ret == "" {
		b.WriteString("    IF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN RETURN OLD; END IF;\n    RETURN NEW;\n")
	} else {
		fmt.Fprintf(b, "    RETURN %s;\n", ret)
	}
	b.WriteString("  END IF;\n")
}

// rowBody is the PL/pgSQL body of g's row trigger. See the package doc for
// the rule; the messages match the rewriter's where both can raise them.
func rowBody(g sqlrewrite.Guard, o Options) string {
	setting := o.setting()
	col := "NEW." + ident(g.Column)
	old := "OLD." + ident(g.Column)
	shadow := g.Rollout == sqlrewrite.Shadow
	var b strings.Builder
	b.WriteString("\nDECLARE\n  t text;\n  tok pg_catalog.int8;\n  epoch pg_catalog.int8;\n")
	if g.Domain != "" {
		b.WriteString("  d text;\n")
	}
	b.WriteString("BEGIN\n")
	exempt(&b, o, "")
	fmt.Fprintf(&b, "  t := pg_catalog.current_setting(%s, true);\n", literal(setting))
	b.WriteString("  IF t OPERATOR(pg_catalog.=) '' THEN t := NULL; END IF;\n")
	pooled(&b, g, o, "t", "NULL", setting)
	names := setting
	if g.Domain != "" {
		ds := setting + "." + g.Domain
		names = ds + " or " + setting
		// The precedence rule (see sqlrewrite's tokenText): a leftover
		// per-domain token must not silently override the one just set.
		fmt.Fprintf(&b, "  d := pg_catalog.current_setting(%s, true);\n", literal(ds))
		pooled(&b, g, o, "d", "''", ds)
		fmt.Fprintf(&b, `  IF d OPERATOR(pg_catalog.<>) '' THEN
    IF t IS NOT NULL AND t OPERATOR(pg_catalog.<>) d THEN
      RAISE EXCEPTION USING ERRCODE = '22023',
        MESSAGE = pg_catalog.format('pgfence: both %s and %s are set, to different tokens (%%L and %%L), for a write to guarded table %%I.%%I in lock domain %s', d, t, TG_TABLE_SCHEMA, TG_TABLE_NAME),
        HINT = %s;
    END IF;
    t := d;
  END IF;
`, ds, setting, doubleQuoted(g.Domain),
			literal("a per-domain token left over from another lease must not override the one you set: RESET the setting of the lease you do not hold (RESET "+ds+"), or set both to the same token"))
	}
	switch {
	case shadow:
		// As the rewriter's lenient token: a missing token, or one that
		// is no int8, fences nothing and fails nothing; INSERTs stamp 0
		// and UPDATEs keep the row's epoch.
		fmt.Fprintf(&b, `  IF t OPERATOR(pg_catalog.~) %s THEN
    IF t::pg_catalog.numeric OPERATOR(pg_catalog.<=) 9223372036854775807::pg_catalog.numeric
       AND t::pg_catalog.numeric OPERATOR(pg_catalog.>=) (-9223372036854775808)::pg_catalog.numeric THEN
      tok := t::pg_catalog.int8;
    END IF;
  END IF;
  IF tok IS NULL THEN
    IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
      %s := 0;
      RETURN NEW;
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN RETURN OLD; END IF;
    %s := %s;
    RETURN NEW;
  END IF;
`, literal(tokenRE), col, col, old)
	default:
		b.WriteString("  IF t IS NULL THEN\n")
		if g.AllowMissingToken {
			// Through unfenced; an UPDATE keeps the row's epoch and an
			// INSERT is stamped 0, as the rewriter stamps it
			// (COALESCE(token, 0)): no epoch is forged without a token.
			fmt.Fprintf(&b, "    IF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN RETURN OLD; END IF;\n")
			fmt.Fprintf(&b, "    IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN %s := %s; ELSE %s := 0; END IF;\n    RETURN NEW;\n", col, old, col)
		} else {
			fmt.Fprintf(&b, `    RAISE EXCEPTION USING ERRCODE = '55000',
      MESSAGE = pg_catalog.format('pgfence: no fencing token is set for this write to guarded table %%I.%%I; set %s first', TG_TABLE_SCHEMA, TG_TABLE_NAME),
      HINT = %s;
`, names, literal("set the lease's fencing token first: SET "+setting+" = '<token>' (or SET LOCAL inside a transaction)"))
		}
		b.WriteString("  END IF;\n")
		// As the rewriter: any character besides white space, signs and
		// digits is pgfence's 22023; the cast raises Postgres's own 22P02
		// or 22003 for the rest of what is no int8.
		// E'' so that the pattern reads the same whatever
		// standard_conforming_strings the function is compiled under.
		fmt.Fprintf(&b, `  IF t OPERATOR(pg_catalog.~) E'[^-+0-9\\s]' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = pg_catalog.format('pgfence: %s must be an integer fencing token for a write to guarded table %%I.%%I, got: %%s', TG_TABLE_SCHEMA, TG_TABLE_NAME, t),
      HINT = %s;
  END IF;
  tok := t::pg_catalog.int8;
`, names, literal("the fencing token must be a whole number, e.g. SET "+setting+" = '42'"))
	}
	stale := func(kind, epoch string) {
		if shadow {
			fmt.Fprintf(&b, "    PERFORM pgfence.note_reject(TG_RELID, %s, 'shadow', %s, tok);\n", literal(kind), epoch)
			return
		}
		// Counted before the error too (the counter and the notice outlive
		// the rollback), as the stale domain INSERT below is.
		fmt.Fprintf(&b, `    PERFORM pgfence.note_reject(TG_RELID, %s, 'enforce', %s, tok);
    IF pg_catalog.pg_trigger_depth() OPERATOR(pg_catalog.>) 1 THEN
      RAISE EXCEPTION USING ERRCODE = '%s',
        MESSAGE = pg_catalog.format('pgfence: stale fencing token %%s for a %%s of guarded table %%I.%%I made by another write (a foreign-key cascade or a trigger): %s; refused rather than leave that write half done', tok, TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME),
        HINT = 'stop writing: a newer lock holder has written here; re-acquire the lock';
    END IF;
    RETURN NULL;
`, literal(kind), epoch, CodeStaleCascade, staleWhy(kind))
	}
	if g.Domain != "" && g.Rollout == sqlrewrite.Enforce {
		fmt.Fprintf(&b, "  IF NOT pgfence.claim_domain(%s, tok) THEN\n", literal(g.Domain))
		// A stale INSERT fails, as the rewriter's does: it has no row
		// whose epoch could have kept it out.
		fmt.Fprintf(&b, `    IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
      PERFORM pgfence.note_reject(TG_RELID, 'domain', 'enforce', NULL, tok);
      RAISE EXCEPTION USING ERRCODE = 'PF001',
        MESSAGE = pg_catalog.format('pgfence: stale fencing token for lock domain %s (guarded table %%I.%%I): a newer holder has written to it; stop writing and re-acquire the lock; token: %%s', TG_TABLE_SCHEMA, TG_TABLE_NAME, tok);
    END IF;
`, doubleQuoted(g.Domain))
		stale("domain", "NULL")
		b.WriteString("  END IF;\n")
	}
	fmt.Fprintf(&b, "  IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN\n    %s := tok;\n    RETURN NEW;\n  END IF;\n", col)
	fmt.Fprintf(&b, "  epoch := %s;\n", old)
	b.WriteString("  IF epoch OPERATOR(pg_catalog.>) tok THEN\n")
	stale("row", "epoch")
	if shadow {
		b.WriteString("    tok := epoch; -- never lowered\n")
	}
	b.WriteString("  END IF;\n")
	b.WriteString("  IF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN RETURN OLD; END IF;\n")
	fmt.Fprintf(&b, "  %s := tok;\n  RETURN NEW;\nEND\n", col)
	return b.String()
}

// pooled writes, for a pooled role's session (Options.PooledRoles), the
// test that drops the token in variable v, read from setting, unless
// pgfence set it in this transaction: v becomes none, or, where a missing
// token fails the write, the write fails saying why.
func pooled(b *strings.Builder, g sqlrewrite.Guard, o Options, v, none, setting string) {
	if len(o.PooledRoles) == 0 {
		return
	}
	fmt.Fprintf(b, `  IF %s OPERATOR(pg_catalog.<>) '' AND SESSION_USER OPERATOR(pg_catalog.=) ANY (%s)
     AND pg_catalog.split_part(COALESCE(pg_catalog.current_setting(%s, true), ''), ' ', 2) OPERATOR(pg_catalog.<>) %s THEN
`, v, roleArray(o.PooledRoles), literal(sqlrewrite.PooledMarker(asciiLower(setting))), sqlrewrite.PooledStamp)
	if g.Rollout == sqlrewrite.Enforce && !g.AllowMissingToken {
		fmt.Fprintf(b, `    RAISE EXCEPTION USING ERRCODE = '55000',
      MESSAGE = pg_catalog.format('pgfence: no fencing token was set by pgfence in this transaction for this write to guarded table %%I.%%I: role %%s reaches Postgres through a transaction pooler, where the %s a server connection holds may be another client''s', TG_TABLE_SCHEMA, TG_TABLE_NAME, SESSION_USER),
      HINT = %s;
`, setting, literal("pgfence sets the token ahead of each statement it sees may write: a text with no write keyword and no function call (a SELECT of a view whose function writes, say) gets none; call the writing function in the text, e.g. SELECT f()"))
	} else {
		fmt.Fprintf(b, "    %s := %s;\n", v, none)
	}
	b.WriteString("  END IF;\n")
}

// asciiLower folds ASCII upper case, as Postgres folds setting names.
func asciiLower(s string) string {
	return strings.Map(func(r rune) rune {
		if 'A' <= r && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}, s)
}

// tokenRE is what a token must look like to be cast to int8 (as the
// rewriter's lenient token reads it).
const tokenRE = `^\s*[-+]?[0-9]{1,19}\s*$`

func staleWhy(kind string) string {
	if kind == "domain" {
		return "its lock domain has a newer token"
	}
	return "the row''s epoch is newer"
}

// ident double-quotes an identifier.
func ident(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// literal makes a string literal that reads the same whatever
// standard_conforming_strings is: E” when it holds a backslash.
func literal(s string) string {
	if strings.Contains(s, `\`) {
		return `E'` + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), `'`, `''`) + `'`
	}
	return `'` + strings.ReplaceAll(s, `'`, `''`) + `'`
}

// doubleQuoted puts a name in double quotes inside a format() string (its
// % doubled).
func doubleQuoted(s string) string {
	return `"` + strings.ReplaceAll(strings.ReplaceAll(s, `'`, `''`), `%`, `%%`) + `"`
}

// dollarQuote quotes a function body with a tag it does not contain.
func dollarQuote(body string) string {
	tag := "$pgfence$"
	for i := 0; strings.Contains(body, tag); i++ {
		tag = fmt.Sprintf("$pgfence%d$", i)
	}
	return tag + body + tag
}
