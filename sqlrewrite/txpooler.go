package sqlrewrite

import (
	"strconv"
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// Behind a transaction pooler a session's settings stay on a server
// connection that other clients use next, so pgfence keeps the session's
// token settings itself and sets them anew, for the transaction only, in
// each transaction that may need them (PooledSet; TxStarts finds where a
// Query starts a transaction of its own). That holds only while pgfence
// sees every change of them the session makes: a plain SET or RESET
// (Match, MatchReset). SessionChange finds the statements that would change
// one, or every setting, for the session where pgfence cannot follow.

// The parts of the refusal of a session-level change of the token behind a
// transaction pooler (PooledRefusal), which pooledHint reads back.
const (
	pooledChange  = " would change the fencing token for the session on a server connection that a transaction pooler shares (pgfence runs behind one); pgfence follows "
	pooledFollows = " only through a plain SET or RESET of it sent on its own outside a transaction block"
)

// PooledRefusal refuses a text that would change the token setting for
// the session behind a transaction pooler, in the way form says.
func PooledRefusal(form, setting string) *Refusal {
	msg := form + pooledChange + setting + pooledFollows
	return &Refusal{Code: codeUnsupported, Message: "pgfence: " + msg, Hint: pooledHint(msg)}
}

// pooledHint is the hint of a PooledRefusal whose message (without
// "pgfence: ") is text, "" for any other.
func pooledHint(text string) string {
	_, rest, ok := strings.Cut(text, pooledChange)
	if !ok {
		return ""
	}
	setting, _, ok := strings.Cut(rest, pooledFollows)
	if !ok {
		return ""
	}
	return "send SET " + setting + " = '<token>' on its own outside a transaction block, or use SET LOCAL (or set_config(..., true)) inside one"
}

// MatchReset reports whether sql is exactly one RESET of a token setting,
//
//	RESET <name> [;]
//
// (name in any case, its parts quoted or not) and if so which setting
// (lower case; Value is "", Reset is set).
func (ts TokenSettings) MatchReset(sql string) (TokenSet, bool) {
	i := space(sql, 0)
	if !word(sql, i, "reset") {
		return TokenSet{}, false
	}
	set := ts.matchReset(sql, i)
	return set, set.Name != ""
}

// matchReset is MatchReset of sql, whose first word, at sql[i], is RESET:
// the zero TokenSet when it is not one RESET of a token setting.
func (ts TokenSettings) matchReset(sql string, i int) TokenSet {
	counted("token setting", sql)
	i = space(sql, i+len("reset"))
	start := i
	i, quoted, ok := settingName(sql, i)
	if !ok {
		return TokenSet{}
	}
	spelled := sql[start:i]
	i = space(sql, i)
	if i < len(sql) && sql[i] == ';' {
		i = space(sql, i+1)
	}
	if i != len(sql) {
		return TokenSet{}
	}
	n, ok := ts.named(spelled, quoted)
	if !ok || quoted && !parsedAs(sql, n, pg_query.VariableSetKind_VAR_RESET, false) {
		return TokenSet{}
	}
	return TokenSet{Name: n, Reset: true}
}

// SessionChange reports whether sql may change a token setting for the
// session rather than for its transaction, in a way other than the one
// plain SET or RESET that Match and MatchReset read, and if so names the
// form: a SET or RESET of it among other statements or not plain, RESET
// ALL, DISCARD ALL, or set_config on it (or on a name it computes) whose
// third argument is not the constant true. Every setting in the token
// setting's namespace counts (<token setting>.<anything>, which lock
// domains use: one may be a domain's after a reload), however its name is
// written. SET LOCAL and set_config(..., true) last until the transaction
// ends and are no such change. A text that names neither a token setting,
// set_config, RESET nor DISCARD is cleared without parsing.
//
// A text that may be such a change and that pgfence's parser cannot read
// may still be one on the server, whose grammar may differ (see skew.go):
// then ok is true, form is "a statement pgfence cannot read", and unread
// is the refusal to send instead (42601, quoting the parser's error).
func (ts TokenSettings) SessionChange(sql string) (form string, ok bool, unread *Refusal) {
	if len(ts.names) == 0 {
		return "", false, nil
	}
	s := scan{want: sessionNeedles}
	if s.run(sql, nil, ts.words); !s.found.mayChangeSession() {
		return "", false, nil
	}
	return ts.sessionChange(sql)
}

// sessionChange is SessionChange of a text its prefilter (or Analyze)
// did not clear.
func (ts TokenSettings) sessionChange(sql string) (form string, ok bool, unread *Refusal) {
	if len(ts.names) == 0 {
		return "", false, nil
	}
	if ref := ts.tooLong(sql); ref != nil {
		return "a statement too long for pgfence to read", true, ref
	}
	counted("parse", sql)
	tree, err := pg_query.Parse(sql)
	if err != nil {
		if !ts.mayChangeUnread(sql) {
			return "", false, nil
		}
		return "a statement pgfence cannot read", true, unparsableSessionChange(err)
	}
	for _, raw := range tree.Stmts {
		eachMessage(raw.ProtoReflect(), func(m proto.Message) {
			if ok {
				return
			}
			form, ok = ts.changeIn(m)
		})
		if ok {
			return form, true, nil
		}
	}
	return "", false, nil
}

// mayChangeUnread is mayChangeSession for a text the parser rejected,
// with the scanner's help: RESET and DISCARD only count as keywords (not
// in reset_at, say), as they must be to change anything; a text the
// scanner rejects too counts.
func (ts TokenSettings) mayChangeUnread(sql string) bool {
	if ContainsFold(sql, ts.names[0]) || ContainsFold(sql, "set_config") {
		return true
	}
	scan, err := pg_query.Scan(sql)
	if err != nil {
		return true
	}
	for _, t := range scan.Tokens {
		if t.Token == pg_query.Token_RESET || t.Token == pg_query.Token_DISCARD {
			return true
		}
	}
	return false
}

// changeIn is the session change node m makes, if any (see SessionChange).
func (ts TokenSettings) changeIn(m proto.Message) (string, bool) {
	switch n := m.(type) {
	case *pg_query.VariableSetStmt:
		switch {
		case n.Kind == pg_query.VariableSetKind_VAR_RESET_ALL:
			return "RESET ALL", true
		case n.IsLocal || !ts.isToken(n.Name):
			return "", false
		case n.Kind == pg_query.VariableSetKind_VAR_RESET:
			return "RESET " + n.Name, true
		}
		return "SET " + n.Name, true
	case *pg_query.DiscardStmt:
		if n.Target == pg_query.DiscardMode_DISCARD_ALL {
			return "DISCARD ALL", true
		}
	case *pg_query.FuncCall:
		if len(n.Funcname) == 0 || n.Funcname[len(n.Funcname)-1].GetString_().GetSval() != "set_config" || len(n.Args) != 3 {
			return "", false
		}
		if c := n.Args[2].GetAConst(); c != nil && c.GetBoolval() != nil && c.GetBoolval().Boolval {
			return "", false // is_local: the transaction's only
		}
		if c := n.Args[0].GetAConst(); c != nil && c.GetSval() != nil && !ts.isToken(c.GetSval().Sval) {
			return "", false // another setting
		}
		return "set_config(..., false)", true
	}
	return "", false
}

// leadWritesNothing is WritesNothing of a text of one statement whose
// first word is at sql[i]; setConfig and concurrently say whether the text
// spells set_config and concurrently anywhere, ignoring ASCII case.
func leadWritesNothing(sql string, i int, setConfig, concurrently bool) bool {
	first := leadWord(sql, i)
	if first == "" {
		return false
	}
	switch {
	case isAnyWord(first, "begin", "start", "commit", "end", "rollback", "abort", "savepoint", "release",
		"show", "reset", "discard", "deallocate", "listen", "unlisten", "notify",
		"vacuum", "analyze", "analyse", "checkpoint", "cluster", "load", "close", "lock", "reindex"):
		return true
	case isWord(first, "set"):
		return !setConfig
	case isAnyWord(first, "create", "drop", "alter"):
		second := leadWord(sql, skipSpace(sql, i+len(first)))
		if isAnyWord(second, "database", "tablespace", "system", "subscription") {
			return true
		}
		return concurrently && isAnyWord(second, "index", "unique")
	}
	return false
}

// isAnyWord reports whether s is one of lower, ignoring ASCII case.
func isAnyWord(s string, lower ...string) bool {
	for _, w := range lower {
		if isWord(s, w) {
			return true
		}
	}
	return false
}

// leadWord returns the ASCII word at sql[i:], as written.
func leadWord(sql string, i int) string {
	j := i
	for j < len(sql) && (sql[j]|0x20 >= 'a' && sql[j]|0x20 <= 'z') {
		j++
	}
	if j < len(sql) && isIdentCont(sql[j]) {
		return "" // part of a longer name
	}
	return sql[i:j]
}

// leadShows reports whether first, a text's first word, is SHOW, SET or
// RESET.
func leadShows(first string) bool { return isAnyWord(first, "show", "set", "reset") }

// TxStart is a statement of a text that starts a transaction of its own:
// one after a statement that ends a transaction.
type TxStart struct {
	// Offset is the byte offset in the text where the statement starts
	// (its leading white space and comments included).
	Offset int
	// Index is its index among the text's statements.
	Index int
}

// TxStarts returns the statements of sql, a simple Query's text, that
// start a transaction of their own: each one after a COMMIT, END,
// ROLLBACK, ABORT (with or without AND CHAIN), PREPARE TRANSACTION, COMMIT
// PREPARED or ROLLBACK PREPARED. Behind a transaction pooler the session's
// token settings must be set again ahead of each, as what was set for the
// transaction before ended with it. A text of one statement, or that
// spells none of those words, has none and is not parsed.
//
// A text that spells one of them and that pgfence's parser cannot read
// may still end a transaction and go on on the server (see skew.go):
// TxStarts then returns the refusal to send instead (42601).
func TxStarts(sql string) ([]TxStart, *Refusal) {
	var s scan
	if s.run(sql, nil, nil); s.oneStatement(sql) || !s.txEnd {
		return nil, nil
	}
	return txStarts(sql)
}

// txStarts is TxStarts of a text its prefilter (or Analyze) did not clear.
func txStarts(sql string) ([]TxStart, *Refusal) {
	counted("parse", sql)
	tree, err := pg_query.Parse(sql)
	if err != nil {
		return nil, unparsableRefusal(err,
			"may end a transaction and go on with more statements on a server connection that a transaction pooler shares (pgfence runs behind one)",
			"run those without the session's fencing token")
	}
	var starts []TxStart
	for i, raw := range tree.Stmts[:max(len(tree.Stmts)-1, 0)] {
		if endsTx(raw.Stmt) {
			starts = append(starts, TxStart{Offset: int(tree.Stmts[i+1].StmtLocation), Index: i + 1})
		}
	}
	return starts, nil
}

// endsTx reports whether stmt ends the transaction it runs in.
func endsTx(stmt *pg_query.Node) bool {
	t := stmt.GetTransactionStmt()
	if t == nil {
		return false
	}
	switch t.Kind {
	case pg_query.TransactionStmtKind_TRANS_STMT_COMMIT, pg_query.TransactionStmtKind_TRANS_STMT_ROLLBACK,
		pg_query.TransactionStmtKind_TRANS_STMT_PREPARE, pg_query.TransactionStmtKind_TRANS_STMT_COMMIT_PREPARED,
		pg_query.TransactionStmtKind_TRANS_STMT_ROLLBACK_PREPARED:
		return true
	}
	return false
}

// The marker of the token settings pgfence set in a transaction behind a
// transaction pooler is the setting pgfence.tx.<name>.
const pooledMarker = "pgfence.tx."

// PooledMarker names the marker of the token setting name (lower case),
// which PooledSet sets to the proxy's nonce, a space and PooledStamp.
func PooledMarker(name string) string { return pooledMarker + name }

// PooledStamp is the expression for the transaction's start that a pooled
// marker holds after its nonce and a space: the database backstop trusts a
// token a pooled role's session holds only in the transaction whose stamp
// its marker holds (see backstop.Options.PooledRoles), so a token left for
// the session on a server connection counts in no later transaction. Its
// text is the same whatever the session's settings (numeric, not a
// timestamp's text, which DateStyle and TimeZone change).
const PooledStamp = "pg_catalog.extract(E'epoch', pg_catalog.now())::pg_catalog.text"

// PooledSet returns the statement that sets the token settings names
// (lower case) for the transaction it runs in, behind a transaction pooler,
// unless it has already run in that transaction, in pieces to join around
// its arguments: parts[0] A0 parts[1] A1 ... parts[len(args)], where Aj is
// argument args[j], 0 for the nonce the proxy draws for the transaction
// and i for the session's value of names[i-1] ("" for none), each a text
// parameter ($1 for the nonce, $i+1 for value i) or a literal.
//
// For each setting it reads the marker pgfence.tx.<name>: unless it holds
// the nonce and the transaction's stamp (PooledStamp), it sets the setting
// to "" for the session, then to its value for the transaction, and the
// marker to the nonce and the stamp for the transaction. So:
//
//   - It sets each setting once per transaction: a SET LOCAL the client
//     runs after it in the same transaction stands.
//   - A marker a client left for the session on the server connection
//     (where pgfence cannot see it: in a function, say) stops nothing: the
//     proxy draws a new nonce once a transaction of the session has ended,
//     so no client, the session's own included, can know one still to be
//     used, even if it read one (in a marker, or in a Query's text that
//     pg_stat_activity shows).
//   - A token a client left for the session there, the same way, is gone
//     for the session once the transaction commits (a procedure that
//     commits and writes on finds no token, and fails closed), and before
//     that the transaction reads its own value.
//   - A transaction it did not run in (its text wrote nothing pgfence
//     could see) reads whatever the server connection holds; the
//     backstop of a pooled role trusts no token there whose marker lacks
//     that transaction's stamp.
//
// Every operator and function is schema-qualified, so the client's
// search_path cannot change what it does.
func PooledSet(names []string) (parts []string, args []int) {
	text := "SELECT "
	// The marker's value, after the nonce's argument: in parentheses, as
	// OPERATOR() spellings share one precedence, left to right.
	stamped := " OPERATOR(pg_catalog.||) " + quoteLiteral(" ") + " OPERATOR(pg_catalog.||) " + PooledStamp + ")"
	arg := func(a int) {
		parts, args = append(parts, text), append(args, a)
		text = "::pg_catalog.text"
	}
	for i, n := range names {
		if i > 0 {
			text += ", "
		}
		name, marker := quoteLiteral(n), quoteLiteral(pooledMarker+n)
		text += "CASE WHEN COALESCE(pg_catalog.current_setting(" + marker + ", true), " + quoteLiteral("") + ") OPERATOR(pg_catalog.<>) ("
		arg(0)
		text += stamped + " THEN pg_catalog.set_config(" + name + ", " + quoteLiteral("") + ", false) OPERATOR(pg_catalog.||) pg_catalog.set_config(" + name + ", "
		arg(i + 1)
		text += ", true) OPERATOR(pg_catalog.||) pg_catalog.set_config(" + marker + ", ("
		arg(0)
		text += stamped + ", true) END"
	}
	if len(names) == 0 {
		text += "NULL" // nothing to set: still one statement, one column
	}
	return append(parts, text), args
}

// PooledSetSQL is PooledSet's statement for names as the proxy sends it
// (see proxy.NewPooledSet), so that the proxy writes no SQL of its own:
// ext has the arguments as parameters, $1 the nonce and $i+1 the value of
// names[i-1]; text makes it with them as literals, nonce and values
// (values[i] the session's value of names[i]), ended with a semicolon to
// go in front of a Query's statements.
func PooledSetSQL(names []string) (ext string, text func(nonce string, values []string) string) {
	parts, args := PooledSet(names)
	var b strings.Builder
	for i, a := range args {
		b.WriteString(parts[i])
		b.WriteString("$" + strconv.Itoa(a+1))
	}
	b.WriteString(parts[len(args)])
	return b.String(), func(nonce string, values []string) string {
		var b strings.Builder
		for i, a := range args {
			b.WriteString(parts[i])
			if a == 0 {
				b.WriteString(quoteLiteral(nonce))
			} else {
				b.WriteString(quoteLiteral(values[a-1]))
			}
		}
		b.WriteString(parts[len(args)])
		b.WriteString(";")
		return b.String()
	}
}
