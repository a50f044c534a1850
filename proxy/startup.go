package proxy

import (
	"encoding/binary"
	"strings"
)

// The settings a client's startup packet makes: every parameter but user,
// database, replication, options and the protocol's own (_pq_.*) is one,
// and so is each -c name=value and --name=value switch in options, which
// Postgres splits at white space (a backslash keeps the next byte as is)
// and reads as its command line. The proxy refuses a packet that sets one
// of pgfence's own settings, in every mode; behind a transaction pooler it
// takes the token settings out, to keep them as the session's and set
// them in each transaction (see Transaction pooling in the package
// documentation), where the pooler would drop them or refuse the client.

// internalPrefix starts the names of pgfence's own settings (the proxy's
// markers among them); sqlrewrite.InternalPrefix is the same, for SQL.
const internalPrefix = "pgfence."

// codeInsufficientPrivilege is what a client that sets one of pgfence's
// own settings gets.
const codeInsufficientPrivilege = "42501"

// startupParam is one parameter of a startup packet.
type startupParam struct{ name, value string }

// startupParams reads the parameters of a StartupMessage packet (length,
// protocol code, then name and value pairs up to an empty name), in order.
func startupParams(packet []byte) ([]startupParam, bool) {
	if len(packet) < 8 {
		return nil, false
	}
	var ps []startupParam
	b := packet[8:]
	for {
		name, rest, err := cstring(b)
		if err != nil {
			return nil, false
		}
		if len(name) == 0 {
			return ps, len(rest) == 0
		}
		value, rest, err := cstring(rest)
		if err != nil {
			return nil, false
		}
		ps = append(ps, startupParam{string(name), string(value)})
		b = rest
	}
}

// encodeStartup writes a StartupMessage of protocol code with params.
func encodeStartup(code uint32, params []startupParam) []byte {
	b := make([]byte, 8, 64)
	binary.BigEndian.PutUint32(b[4:], code)
	for _, p := range params {
		b = append(append(append(append(b, p.name...), 0), p.value...), 0)
	}
	b = append(b, 0)
	binary.BigEndian.PutUint32(b, uint32(len(b)))
	return b
}

// startupSettings is what checkStartup finds in a startup packet.
type startupSettings struct {
	// packet is the packet to forward: the client's, or one without the
	// token settings taken out.
	packet []byte
	// tokens are the token settings taken out (names lower case).
	tokens []Setting
	// internal is the first of pgfence's own settings it sets, "" for none.
	internal string
}

// checkStartup reads the settings of a startup packet (see above): it
// notes one of pgfence's own, and under TransactionPooling takes out the
// token settings (TokenSetting and the names under it, where lock domains'
// are). A packet it cannot read is forwarded as is, for Postgres to
// refuse.
func (s *Server) checkStartup(packet []byte) startupSettings {
	out := startupSettings{packet: packet}
	params, ok := startupParams(packet)
	if !ok {
		return out
	}
	token := strings.ToLower(s.cfg.TokenSetting)
	isToken := func(name string) bool {
		return s.cfg.TransactionPooling && token != "" && (name == token || strings.HasPrefix(name, token+"."))
	}
	changed := false
	kept := params[:0:0]
	for _, p := range params {
		switch {
		case p.name == "user" || p.name == "database" || p.name == "replication" || strings.HasPrefix(p.name, "_pq_."):
		case p.name == "options":
			args := splitOptions(p.value)
			var drop []optSetting
			for _, o := range optionSettings(args) {
				name := strings.ToLower(o.name)
				switch {
				case strings.HasPrefix(name, internalPrefix) && out.internal == "":
					out.internal = name
				case isToken(name) && o.hasValue:
					out.tokens = append(out.tokens, Setting{Name: name, Value: o.value})
					drop = append(drop, o)
				}
			}
			if len(drop) == 0 {
				break
			}
			changed = true
			if p.value = joinOptions(dropOptions(args, drop)); p.value == "" {
				continue
			}
		default:
			name := strings.ToLower(p.name)
			switch {
			case strings.HasPrefix(name, internalPrefix) && out.internal == "":
				out.internal = name
			case isToken(name):
				out.tokens = append(out.tokens, Setting{Name: name, Value: p.value})
				changed = true
				continue
			}
		}
		kept = append(kept, p)
	}
	if changed {
		out.packet = encodeStartup(binary.BigEndian.Uint32(packet[4:8]), kept)
	}
	return out
}

// splitOptions splits a startup packet's options as Postgres's
// pg_split_opts does: at ASCII white space, a backslash taking the byte
// after it as is.
func splitOptions(opts string) []string {
	var args []string
	var b strings.Builder
	in, escaped := false, false
	for i := 0; i < len(opts); i++ {
		c := opts[i]
		switch {
		case escaped:
			b.WriteByte(c)
			escaped = false
		case c == '\\':
			escaped, in = true, true
		case isSpace(c):
			if in {
				args = append(args, b.String())
				b.Reset()
				in = false
			}
		default:
			b.WriteByte(c)
			in = true
		}
	}
	if in {
		args = append(args, b.String())
	}
	return args
}

// joinOptions joins args so that splitOptions reads them back.
func joinOptions(args []string) string {
	var b strings.Builder
	for i, a := range args {
		if i > 0 {
			b.WriteByte(' ')
		}
		for j := 0; j < len(a); j++ {
			if a[j] == '\\' || isSpace(a[j]) {
				b.WriteByte('\\')
			}
			b.WriteByte(a[j])
		}
	}
	return b.String()
}

// isSpace is C's isspace in the C locale.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

// postgresSwitches are the switches Postgres's process_postgres_switches
// reads with getopt; a letter followed by ':' takes an argument.
const postgresSwitches = "B:bc:C:D:d:EeFf:h:ijk:lN:nOPp:r:S:sTt:v:W:-:"

// optSetting is a setting that options make with -c name=value or
// --name=value.
type optSetting struct {
	name, value string
	hasValue    bool // the argument has an '=' (Postgres refuses one without)
	flag        int  // the argument of args that holds the switch
	at          int  // where the switch's letter is in it
	arg         int  // the argument that holds its value: flag, or the next
}

// optionSettings reads the settings args (split options) make as getopt
// does for Postgres: switches grouped after one '-', a switch's argument
// the rest of its word or the next word, "--" ending them; in a name,
// Postgres reads '-' as '_' (ParseLongOption). Past what Postgres would
// refuse (an unknown switch, a word that is none) it reads on, which can
// only find more than Postgres would.
func optionSettings(args []string) []optSetting {
	var out []optSetting
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if len(a) < 2 || a[0] != '-' {
			continue
		}
		for j := 1; j < len(a); j++ {
			k := strings.IndexByte(postgresSwitches, a[j])
			if k < 0 || a[j] == ':' {
				break
			}
			if k+1 == len(postgresSwitches) || postgresSwitches[k+1] != ':' {
				continue // a switch without an argument
			}
			o := optSetting{flag: i, at: j, arg: i}
			var v string
			switch {
			case j+1 < len(a):
				v = a[j+1:]
			case i+1 < len(args):
				i++
				o.arg, v = i, args[i]
			default:
				return out // no argument: Postgres refuses the session
			}
			if a[j] == 'c' || a[j] == '-' {
				name, value, ok := strings.Cut(v, "=")
				o.name, o.value, o.hasValue = strings.ReplaceAll(name, "-", "_"), value, ok
				out = append(out, o)
			}
			break
		}
	}
	return out
}

// dropOptions returns args without the switches drop.
func dropOptions(args []string, drop []optSetting) []string {
	gone := make([]bool, len(args))
	cut := make(map[int]int) // argument -> where its word now ends
	for _, o := range drop {
		if o.arg != o.flag {
			gone[o.arg] = true
		}
		if o.at == 1 {
			gone[o.flag] = true
		} else {
			cut[o.flag] = o.at // the switches grouped before it stay
		}
	}
	var out []string
	for i, a := range args {
		switch {
		case gone[i]:
		case cut[i] > 0:
			out = append(out, a[:cut[i]])
		default:
			out = append(out, a)
		}
	}
	return out
}
