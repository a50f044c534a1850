package sqlrewrite

// What only the tests call: single facts of Classify, and scans the
// package's own entry points make on the way.

// MayInvalidate reports Classify(sql).Has(Invalidates).
func MayInvalidate(sql string) bool { return Classify(sql).Has(Invalidates) }

// EndsTransaction reports Classify(sql).Has(EndsTx).
func EndsTransaction(sql string) bool { return Classify(sql).Has(EndsTx) }

// MayTouch is a conservative, allocation-free prefilter: it returns false
// only when sql cannot name one of r's guarded tables (see Touches).
func (r *Rewriter) MayTouch(sql string) bool {
	if len(r.needles) == 0 {
		return false
	}
	for i := range len(sql) {
		if r.nameAt(sql, i) {
			return true
		}
	}
	return false
}

// Parameterize is parameterize taking every literal out it may.
func Parameterize(sql string) (p Parameterized, writes bool) {
	return parameterize(sql, nil)
}

// CountScans has f told of each read of a text by one of the package's
// scanners (see counted) until the function it returns is called. Not
// for parallel tests.
func CountScans(f func(what, sql string)) (stop func()) {
	countHook = f
	return func() { countHook = nil }
}

// pooledAnalysis is sql's analysis behind a transaction pooler by a
// Rewriter of no guards whose token setting is token.
func pooledAnalysis(sql, token string) Analysis {
	r, err := New(Config{TokenSetting: token})
	if err != nil {
		panic(err)
	}
	return r.Analyze(sql, true)
}

// WritesNothing reports what Analyze says of sql: that it is one statement
// that can run none of the user's SQL, and so write nothing and read no
// token: transaction control, SET, SHOW, LISTEN and the like, and the
// maintenance commands Postgres refuses to run inside a transaction block
// or a pipeline (VACUUM, CREATE INDEX CONCURRENTLY, CREATE DATABASE, ALTER
// SYSTEM...), which a statement of pgfence's ahead of them in their
// transaction would make fail. It looks at the first words only, after
// comments, and says false for anything it does not know or for more than
// one statement.
func WritesNothing(sql string) bool {
	return pooledAnalysis(sql, "fence.token").facts&fWritesNothing != 0
}

// ShowsToken reports what Analyze says of sql, which WritesNothing clears:
// that it may read or set a token setting all the same, a SHOW, SET or
// RESET that spells the token setting's first part (any case, quoted or
// spaced out) or a Unicode escape.
func ShowsToken(sql, token string) bool {
	return pooledAnalysis(sql, token).facts&fShowsToken != 0
}
