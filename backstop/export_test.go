package backstop

import "github.com/pgfence/pgfence/sqlrewrite"

// Installed reports whether the backstop is OK on the table g names
// (schema-qualified).
func (r *Report) Installed(g sqlrewrite.Guard) bool {
	t := r.table(g)
	return t != nil && t.OK
}
