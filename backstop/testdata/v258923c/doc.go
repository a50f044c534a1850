// Package v258923c is the database backstop as pgfence installed it at
// commit 258923c, the last before the backstop recorded its configuration,
// tied the epoch column and guarded DDL (issue 36), and before a
// partitioned table's row trigger was named apart (~pgfence_backstop_p<oid>).
// backstop's TestUpgrade installs a database with it, then runs the
// current Reconcile, as a newer pgfence does at its first read of an
// older one's database.
//
// The files are 258923c's backstop/*.go (not its tests), unchanged but for
// the package clause and this comment, made with
//
//	for f in counts ddl install schema sql; do git show 258923c:backstop/$f.go; done
//
// Under testdata, go build ./..., go vet ./... and staticcheck leave it
// alone; only the test imports it. Do not edit it: it stands for what
// databases in the field hold.
package v258923c
