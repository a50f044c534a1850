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
