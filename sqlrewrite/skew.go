package sqlrewrite

import (
	"strconv"
	"strings"
)

// Grammar version skew (issue 27).
//
// pgfence reads SQL with pg_query, that is with one version of Postgres's
// grammar (parserGrammar), while the server behind it may run another.
// Between PostgreSQL 15 and 17 the keyword lists only grew: system_user
// became a reserved word in 16 (SQL's SYSTEM_USER), so UPDATE t SET
// system_user = 'x' is a plain column assignment on 15 and a syntax error
// here; json, json_array, json_arrayagg, json_object, json_objectagg (16),
// json_exists, json_query, json_scalar, json_serialize, json_table,
// json_value and merge_action (17) became column-name keywords, still
// column names but no longer plain function names; a few more became
// unreserved keywords, which read as names anywhere they did. Where the
// grammars disagree pgfence does this:
//
//   - A text pgfence reads and the server does not (MERGE ... RETURNING,
//     JSON_TABLE, 0x1F on 15) is rewritten as pgfence reads it, and the
//     server refuses it as it would without pgfence: its own error
//     (42601), its position mapped back to the client's text. Nothing is
//     written, as nothing runs.
//   - A text pgfence cannot read passes untouched when the name prefilter
//     clears it (Rewriter.MayTouch: it names no guarded table), or when it
//     spells no write keyword (MayWrite): the server then runs it or
//     refuses it, exactly as without pgfence.
//   - Otherwise it may write a guarded table, and what it writes cannot
//     be known without reading it: it is refused (unparsable), never sent
//     unfenced. The error says that pgfence, not the server, could not read
//     it, quotes the parser's error, and says how to write it so that both
//     read it alike: a word that became a keyword used as a name is
//     written quoted ("system_user"), which every version reads as a name.
//   - Behind a transaction pooler a text the prefilter of
//     TokenSettings.SessionChange passes, and pgfence cannot read, may
//     change the fencing token for the session where pgfence would not
//     follow it: it is refused too (unparsableSessionChange).
//
// The refusals keep SQLSTATE 42601 (syntax_error), the code Postgres gives
// a statement its grammar rejects: pgfence cannot tell a skew from a
// genuine syntax error, and for the latter, the commoner, the client then
// gets the code it gets without pgfence. Either way the statement's text
// must change before it can run, which is what 42601 tells a client; 0A000
// would call every mistyped write a missing feature.
//
// On a server newer than parserGrammar (Config.ServerVersion, PostgreSQL 18
// on; 0 when unknown) the skew goes the other way and is the likelier
// cause: the server's grammar reads what pgfence's cannot (RETURNING WITH
// (OLD AS o, NEW AS n), a VIRTUAL generated column in DDL), and such a
// text, when it may write a guarded table, is refused with 0A000
// (feature_not_supported) and a message naming both versions
// (unparsableNewer): the statement is valid there, and pgfence is what
// lacks the feature. Where the backstop is in place it could run as sent,
// fenced by the triggers, as MERGE does; pgfence refuses it all the same,
// as it cannot tell which tables a text it cannot read writes, nor what
// else in it (a SET of its own settings, DDL that weakens the backstop) it
// would have refused. What it can read (RETURNING old.v, new.v parses as
// column references, and is fenced) is rewritten as on any server. The
// other refusals of what pgfence cannot read (a session change behind a
// pooler, pgfence's own settings) name no guarded table and keep 42601.

// parserGrammar names the grammar pg_query reads SQL with (pg_query_go v6
// is PostgreSQL 17's parser; bump it, and parserMajor, with the import).
const parserGrammar = "PostgreSQL 17's grammar"

// parserMajor is the major version of parserGrammar: a server of a newer
// one may read what pgfence cannot.
const parserMajor = 17

// The parts of an unparsable refusal's message, around the parser's error
// (see unparsableMessage); unparsableHint finds that error between them.
const (
	unparsableStart = "cannot read this statement, which "
	unparsableRead  = ", with pgfence's parser (" + parserGrammar + "): "
	unparsableSkew  = "; the server may read it differently (a word that became a keyword in PostgreSQL 16 or 17, " +
		"such as system_user, is a plain name on older servers), but pgfence refuses what it cannot read rather than "
	unparsableQuote = ": write such a name in double quotes (\"system_user\")"
)

// unparsable refuses text that may write a guarded table and that the
// parser rejected with err (see the design note above): as a version skew
// on a server newer than parserGrammar.
func (r *Rewriter) unparsable(err error) *Refusal {
	const what = "may write a guarded table"
	if r.server/10000 > parserMajor {
		msg := unparsableNewer(strings.ToValidUTF8(err.Error(), "\uFFFD"), what, r.server)
		return &Refusal{Code: codeUnsupported, Message: "pgfence: " + msg, Hint: hintNewer}
	}
	return unparsableRefusal(err, what, "send it unfenced")
}

// unparsableNewer is the message of an unparsable refusal, without
// "pgfence: ", on a server (its server_version_num) newer than
// parserGrammar:
//
//	cannot read this statement, which WHAT, with pgfence's parser
//	(PostgreSQL 17's grammar): PERR; the server runs PostgreSQL 18.4,
//	whose grammar is newer (a version skew): pgfence cannot fence what it
//	cannot read, and refuses it rather than send it unfenced
func unparsableNewer(perr, what string, server int) string {
	return unparsableStart + what + unparsableRead + perr + "; the server runs PostgreSQL " +
		strconv.Itoa(server/10000) + "." + strconv.Itoa(server%10000) + unparsableNewerEnd
}

const unparsableNewerEnd = ", whose grammar is newer (a version skew): pgfence cannot fence what it cannot read, and refuses it rather than send it unfenced"

// hintNewer is the hint of an unparsable refusal on a newer server.
var hintNewer = "write the statement in syntax that PostgreSQL " + strconv.Itoa(parserMajor) + " reads too (for RETURNING, old.col and new.col rather than " +
	"RETURNING WITH (OLD AS o, NEW AS n)), or run a pgfence release whose parser reads the server's grammar"

// isUnparsableNewer reports whether a 0A000 refusal's text (without
// "pgfence: ") is unparsableNewer's.
func isUnparsableNewer(text string) bool {
	return strings.HasPrefix(text, unparsableStart) && strings.HasSuffix(text, unparsableNewerEnd)
}

// unparsableSessionChange refuses text that the parser rejected with err
// and that may change the fencing token for the session behind a
// transaction pooler (see TokenSettings.SessionChange).
func unparsableSessionChange(err error) *Refusal {
	return unparsableRefusal(err,
		"may change the fencing token for the session on a server connection that a transaction pooler shares (pgfence runs behind one)",
		"let the token change where it cannot follow it")
}

func unparsableRefusal(err error, what, instead string) *Refusal {
	msg := unparsableMessage(strings.ToValidUTF8(err.Error(), "\uFFFD"), what, instead)
	return &Refusal{Code: codeSyntax, Message: "pgfence: " + msg, Hint: unparsableHint(msg)}
}

// unparsableMessage is the message of an unparsable refusal, without
// "pgfence: ", for the parser's error perr:
//
//	cannot read this statement, which WHAT, with pgfence's parser
//	(PostgreSQL 17's grammar): PERR; the server may read it differently (a
//	word that became a keyword in PostgreSQL 16 or 17, such as system_user,
//	is a plain name on older servers), but pgfence refuses what it cannot
//	read rather than INSTEAD: write such a name in double quotes
//	("system_user")
func unparsableMessage(perr, what, instead string) string {
	return unparsableStart + what + unparsableRead + perr + unparsableSkew + instead + unparsableQuote
}

// unparsableHint is the hint of an unparsable refusal whose message (without
// "pgfence: ") is text, "" for any other text. Where the parser's error
// points at a word that is a keyword here and a name on PostgreSQL 15
// ("at or near "SYSTEM_USER""), it names the quoted name to write, folded
// to lower case as Postgres folds an unquoted name.
func unparsableHint(text string) string {
	rest, ok := strings.CutPrefix(text, unparsableStart)
	if !ok {
		return ""
	}
	_, rest, ok = strings.Cut(rest, unparsableRead)
	if !ok {
		return ""
	}
	perr, _, ok := strings.Cut(rest, unparsableSkew)
	if !ok {
		return ""
	}
	const otherwise = ", which every PostgreSQL version reads as a name; if the statement is wrong on your server too, correct it"
	if word, ok := nearSkewWord(perr); ok {
		return "if " + word + " is a name in this statement, write it in double quotes, " + quoteIdent(asciiLower(word)) + otherwise
	}
	return "if the statement uses a word that became a keyword in PostgreSQL 16 or 17 as a name, write that name in double quotes, as \"system_user\"" + otherwise
}

// skewWords are the words that are keywords other than unreserved ones in
// parserGrammar and plain names on PostgreSQL 15 (from its
// pg_get_keywords()): where they stand for names, the server may read
// what pgfence cannot. The other keywords added since are unreserved,
// names wherever they were.
var skewWords = map[string]bool{
	// reserved since 16
	"system_user": true,
	// column-name keywords since 16
	"json": true, "json_array": true, "json_arrayagg": true, "json_object": true, "json_objectagg": true,
	// column-name keywords since 17
	"json_exists": true, "json_query": true, "json_scalar": true, "json_serialize": true, "json_table": true,
	"json_value": true, "merge_action": true,
}

// nearSkewWord returns the word a parser error points at ("... at or near
// "WORD""), when it is one of skewWords in any case.
func nearSkewWord(perr string) (string, bool) {
	const near = ` at or near "`
	i := strings.LastIndex(perr, near)
	if i < 0 || !strings.HasSuffix(perr, `"`) {
		return "", false
	}
	word := perr[i+len(near) : len(perr)-1]
	return word, skewWords[asciiLower(word)]
}
