package sqlrewrite

import (
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// DDL that would weaken the database backstop of a guarded table is
// refused in the text, whatever role sends it and whether or not the
// database's own DDL guard is in place (see the backstop package): the
// backstop's triggers dropped, replaced, disabled or renamed, a trigger
// made to fire after it, its functions or pgfence's schema changed, the
// epoch column's type changed, the column dropped or renamed, and, where
// the database's guard cannot give a detached partition a backstop of its
// own at once (Config.DDLGuard), DETACH PARTITION. Such DDL runs straight
// to Postgres, as a role pgfence exempts.

// Names of the backstop's triggers (as the backstop package names them).
const (
	backstopTriggerPrefix = "~pgfence_"
	backstopRowTrigger    = "~pgfence_backstop"
)

// codeWeakens is the SQLSTATE of a refused DDL: insufficient_privilege, as
// the database's guard raises.
const codeWeakens = "42501"

const hintWeakens = "guarded tables keep their backstop triggers and their epoch column; run this DDL straight to Postgres as a role pgfence exempts (--backstop-exempt-role) if it must change them"

// weakens refuses a DDL statement that would leave table g's fence weaker.
func weakens(what string, g *guardInfo) *Refusal {
	return &Refusal{
		Code:    codeWeakens,
		Message: "pgfence: " + what + " of guarded table \"" + g.name + "\" is refused: it would weaken the fence the database keeps on it (the backstop)",
		Hint:    hintWeakens,
	}
}

// MayBeDDL reports whether a text of class cl that spells no write keyword
// may still be DDL the rewriter refuses when it names a guarded table (see
// visitDDL): it may create or alter something, or spells DROP.
func MayBeDDL(sql string, cl Class) bool {
	return cl.Has(ChangesTables) || ContainsFold(sql, "drop")
}

// ddlKeywords are the tokens a DDL statement visitDDL judges starts with.
var ddlKeywords = [...]pg_query.Token{pg_query.Token_ALTER, pg_query.Token_CREATE, pg_query.Token_DROP}

// isBackstopTrigger reports whether name is one of the backstop's
// triggers.
func isBackstopTrigger(name string) bool { return strings.HasPrefix(name, backstopTriggerPrefix) }

// inPgfence reports whether a qualified name (a list of String nodes) is
// in pgfence's schema.
func inPgfence(names []*pg_query.Node) bool {
	return len(names) > 1 && names[len(names)-2].GetString_().GetSval() == "pgfence"
}

// visitDDL judges one DDL statement (see the package note above).
func (r *Rewriter) visitDDL(m proto.Message) *Refusal {
	switch n := m.(type) {
	case *pg_query.AlterTableStmt:
		g, ref := r.guardFor(n.Relation)
		if ref != nil {
			return ref
		}
		for _, c := range n.Cmds {
			c := c.GetAlterTableCmd()
			t := g
			if part := c.GetDef().GetPartitionCmd(); part != nil && t == nil {
				// A guarded partition of a parent that is not guarded.
				if t, ref = r.guardFor(part.Name); ref != nil {
					return ref
				}
			}
			if t == nil {
				continue
			}
			if ref := r.alterTableCmd(c, t); ref != nil {
				return ref
			}
		}
	case *pg_query.RenameStmt:
		g, ref := r.guardFor(n.Relation)
		if g == nil || ref != nil {
			return ref
		}
		switch {
		case n.RenameType == pg_query.ObjectType_OBJECT_COLUMN && n.Subname == g.Column:
			return weakens("renaming the epoch column", g)
		case n.RenameType == pg_query.ObjectType_OBJECT_TRIGGER && isBackstopTrigger(n.Subname):
			return weakens("renaming the backstop trigger", g)
		case n.RenameType == pg_query.ObjectType_OBJECT_TRIGGER && (isBackstopTrigger(n.Newname) || n.Newname > backstopRowTrigger):
			// The text does not say whether it is a BEFORE row trigger,
			// which would then fire after the backstop's: as CREATE
			// TRIGGER is, it is judged by its new name.
			return weakens("renaming a trigger to a name that is the backstop's or sorts after \""+backstopRowTrigger+"\" (a BEFORE row trigger would then fire after the backstop's)", g)
		}
	case *pg_query.CreateTrigStmt:
		g, ref := r.guardFor(n.Relation)
		if g == nil || ref != nil {
			return ref
		}
		const before, insert, update = 1 << 1, 1 << 2, 1 << 4 // pg_trigger.tgtype bits
		switch {
		case isBackstopTrigger(n.Trigname):
			return weakens("a trigger named as the backstop's", g)
		case n.Row && n.Timing&before != 0 && n.Events&(insert|update) != 0 && n.Trigname > backstopRowTrigger:
			return weakens("a BEFORE row trigger firing after the backstop's (its name sorts after \""+backstopRowTrigger+"\")", g)
		}
	case *pg_query.DropStmt:
		for _, o := range n.Objects {
			names := o.GetList().GetItems()
			switch {
			case n.RemoveType == pg_query.ObjectType_OBJECT_TRIGGER && len(names) >= 2:
				trig := names[len(names)-1].GetString_().GetSval()
				rel := &pg_query.RangeVar{Relname: names[len(names)-2].GetString_().GetSval()}
				if len(names) > 2 {
					rel.Schemaname = names[len(names)-3].GetString_().GetSval()
				}
				if g, ref := r.guardFor(rel); ref != nil || g != nil && isBackstopTrigger(trig) {
					if ref != nil {
						return ref
					}
					return weakens("dropping the backstop trigger", g)
				}
			case n.RemoveType == pg_query.ObjectType_OBJECT_SCHEMA && o.GetString_().GetSval() == "pgfence",
				n.RemoveType != pg_query.ObjectType_OBJECT_SCHEMA && inPgfence(objectName(o)):
				return pgfenceObject("DROP")
			}
		}
	case *pg_query.CreateFunctionStmt:
		if inPgfence(n.Funcname) {
			return pgfenceObject("CREATE FUNCTION")
		}
	case *pg_query.AlterFunctionStmt:
		if inPgfence(n.Func.GetObjname()) {
			return pgfenceObject("ALTER FUNCTION")
		}
	case *pg_query.AlterOwnerStmt:
		if inPgfence(objectName(n.Object)) || n.ObjectType == pg_query.ObjectType_OBJECT_SCHEMA && n.Object.GetString_().GetSval() == "pgfence" {
			return pgfenceObject("ALTER ... OWNER TO")
		}
	case *pg_query.AlterObjectSchemaStmt:
		if inPgfence(objectName(n.Object)) {
			return pgfenceObject("ALTER ... SET SCHEMA")
		}
	}
	return nil
}

// objectName is the qualified name of an object a DDL statement names: a
// list of names, or a function's with its arguments.
func objectName(o *pg_query.Node) []*pg_query.Node {
	if o == nil {
		return nil
	}
	if owa := o.GetObjectWithArgs(); owa != nil {
		return owa.Objname
	}
	return o.GetList().GetItems()
}

// pgfenceObject refuses DDL on pgfence's own schema objects.
func pgfenceObject(verb string) *Refusal {
	return &Refusal{
		Code:    codeWeakens,
		Message: "pgfence: " + verb + " of pgfence's own objects (schema pgfence: the backstop's functions, lock domains, counters) is refused through pgfence",
		Hint:    "pgfence keeps them itself: pgfence serve and pgfence init set them up",
	}
}

// alterTableCmd judges one subcommand of an ALTER TABLE of guarded table
// g.
func (r *Rewriter) alterTableCmd(c *pg_query.AlterTableCmd, g *guardInfo) *Refusal {
	if c == nil {
		return nil
	}
	switch c.Subtype {
	case pg_query.AlterTableType_AT_DisableTrig, pg_query.AlterTableType_AT_EnableAlwaysTrig, pg_query.AlterTableType_AT_EnableReplicaTrig:
		if isBackstopTrigger(c.Name) {
			return weakens("disabling the backstop trigger, or enabling it for replicas only or always,", g)
		}
	case pg_query.AlterTableType_AT_DisableTrigAll, pg_query.AlterTableType_AT_DisableTrigUser:
		return weakens("disabling the triggers (the backstop's among them)", g)
	case pg_query.AlterTableType_AT_AlterColumnType:
		if c.Name == g.Column {
			return weakens("changing the type of the epoch column", g)
		}
		if c.GetDef().GetColumnDef().GetRawDefault() != nil {
			// USING gives every row a value of its choosing, in a table
			// rewrite no row trigger sees: a write no fence checks.
			return weakens("changing a column's type with USING (it rewrites the column's values unfenced)", g)
		}
	case pg_query.AlterTableType_AT_DropColumn:
		if c.Name == g.Column {
			return weakens("dropping the epoch column", g)
		}
	case pg_query.AlterTableType_AT_DetachPartition, pg_query.AlterTableType_AT_DetachPartitionFinalize:
		if !r.ddlGuard {
			return &Refusal{
				Code: codeWeakens,
				Message: "pgfence: DETACH PARTITION of guarded table \"" + g.name + "\" would leave the partition without its backstop " +
					"until pgfence reads the catalog again: the database's DDL guard, which gives it one of its own at once, is not in place",
				Hint: "run it straight to Postgres as a role pgfence exempts, or let pgfence's role be a superuser (or run pgfence init as one) so that the guard is in place",
			}
		}
	}
	return nil
}
