package sqlrewrite

// Refuse returns the Result that makes the server raise ref, for callers
// that must refuse a statement for reasons of their own.
func Refuse(ref *Refusal) *Result { return refused(ref) }
