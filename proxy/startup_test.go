package proxy

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

func TestSplitOptions(t *testing.T) {
	for _, tc := range []struct {
		opts string
		args []string
	}{
		{"", nil},
		{"   ", nil},
		{"-c fence.token=7", []string{"-c", "fence.token=7"}},
		{"  -c\tfence.token=7 \n --work_mem=4MB ", []string{"-c", "fence.token=7", "--work_mem=4MB"}},
		{`-c application_name=a\ b`, []string{"-c", "application_name=a b"}},
		{`-c x=a\\b`, []string{"-c", `x=a\b`}},
		{`-c x=a\\\ b`, []string{"-c", `x=a\ b`}},
		{`\-c`, []string{"-c"}},
		{`a\`, []string{"a"}}, // a trailing backslash escapes nothing
		{`\ `, []string{" "}},
	} {
		got := splitOptions(tc.opts)
		if !slices.Equal(got, tc.args) {
			t.Errorf("splitOptions(%q) = %q, want %q", tc.opts, got, tc.args)
		}
		if back := splitOptions(joinOptions(got)); !slices.Equal(back, got) {
			t.Errorf("joinOptions(%q) = %q reads back as %q", got, joinOptions(got), back)
		}
	}
}

func TestOptionSettings(t *testing.T) {
	type set struct{ name, value string }
	for _, tc := range []struct {
		opts string
		want []set
		rest string // the options without the settings named fence.token*
	}{
		{"-c fence.token=7", []set{{"fence.token", "7"}}, ""},
		{"-cfence.token=7", []set{{"fence.token", "7"}}, ""},
		{"--fence.token=7", []set{{"fence.token", "7"}}, ""},
		{"--fence-x.y-z=1", []set{{"fence_x.y_z", "1"}}, "--fence-x.y-z=1"},
		{`-c fence.token=a\ b -c work_mem=4MB`, []set{{"fence.token", "a b"}, {"work_mem", "4MB"}}, "-c work_mem=4MB"},
		{"-c work_mem=4MB -c fence.token.billing=3", []set{{"work_mem", "4MB"}, {"fence.token.billing", "3"}}, "-c work_mem=4MB"},
		{"-ec fence.token=7", []set{{"fence.token", "7"}}, "-e"},
		{"-ecfence.token=7", []set{{"fence.token", "7"}}, "-e"},
		{"-e-fence.token=7", []set{{"fence.token", "7"}}, "-e"},
		{"-B 10 -c fence.token=7", []set{{"fence.token", "7"}}, "-B 10"},
		{"-B -c fence.token=7", nil, "-B -c fence.token=7"},               // -c is -B's argument
		{"-c -c fence.token=7", []set{{"_c", ""}}, "-c -c fence.token=7"}, // so is this one of -c
		{"-- -c fence.token=7", nil, "-- -c fence.token=7"},
		{"x -c fence.token=7", []set{{"fence.token", "7"}}, "x"},
		{"-c", nil, "-c"},
		{"-c fence.token", []set{{"fence.token", ""}}, "-c fence.token"}, // no value: Postgres refuses it
		{"-s -c FENCE.TOKEN=7", []set{{"FENCE.TOKEN", "7"}}, "-s"},
	} {
		args := splitOptions(tc.opts)
		var got []set
		var drop []optSetting
		for _, o := range optionSettings(args) {
			got = append(got, set{o.name, o.value})
			if n := o.name; o.hasValue && len(n) >= len("fence.token") && (n[:11] == "fence.token" || n[:11] == "FENCE.TOKEN") {
				drop = append(drop, o)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("optionSettings(%q) = %q, want %q", tc.opts, got, tc.want)
		}
		if rest := joinOptions(dropOptions(args, drop)); rest != tc.rest {
			t.Errorf("%q without the token settings: %q, want %q", tc.opts, rest, tc.rest)
		}
	}
}

func TestCheckStartup(t *testing.T) {
	packet := func(params ...string) []byte {
		m := pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber, Parameters: map[string]string{}}
		b := make([]byte, 8)
		binary.BigEndian.PutUint32(b[4:], m.ProtocolVersion)
		for i := 0; i < len(params); i += 2 {
			b = append(append(append(append(b, params[i]...), 0), params[i+1]...), 0)
		}
		b = append(b, 0)
		binary.BigEndian.PutUint32(b, uint32(len(b)))
		return b
	}
	pooled := &Server{cfg: Config{TransactionPooling: true, TokenSetting: "Fence.Token"}}
	direct := &Server{cfg: Config{TokenSetting: "fence.token"}}
	for _, tc := range []struct {
		name     string
		srv      *Server
		in       []byte
		out      []byte // nil: the packet as it came
		tokens   []Setting
		internal string
	}{
		{"nothing to do", pooled, packet("user", "u", "database", "d", "options", "-c work_mem=4MB"), nil, nil, ""},
		{"a token in options", pooled, packet("user", "u", "options", "-c fence.token=7 -c work_mem=4MB", "application_name", "a"),
			packet("user", "u", "options", "-c work_mem=4MB", "application_name", "a"), []Setting{{Name: "fence.token", Value: "7"}}, ""},
		{"options with only tokens", pooled, packet("user", "u", "options", "--Fence.Token=7 -c fence.token.billing=8"),
			packet("user", "u"), []Setting{{Name: "fence.token", Value: "7"}, {Name: "fence.token.billing", Value: "8"}}, ""},
		{"a token as a parameter", pooled, packet("user", "u", "FENCE.TOKEN", "7"), packet("user", "u"), []Setting{{Name: "fence.token", Value: "7"}}, ""},
		{"another setting", pooled, packet("user", "u", "fence.tokens", "7", "options", "-c fence.tokenx=1"), nil, nil, ""},
		{"not pooled: tokens go to Postgres", direct, packet("user", "u", "options", "-c fence.token=7", "fence.token.x", "1"), nil, nil, ""},
		{"pgfence's own in options", direct, packet("user", "u", "options", "-c pgfence.stale_0=1"), nil, nil, "pgfence.stale_0"},
		{"pgfence's own, folded", pooled, packet("user", "u", "options", "--PGFENCE.TX.fence.token=y"), nil, nil, "pgfence.tx.fence.token"},
		{"pgfence's own as a parameter", direct, packet("user", "u", "pgfence.noticed", "x"), nil, nil, "pgfence.noticed"},
		{"the protocol's own", pooled, packet("user", "u", "_pq_.fence.token", "x"), nil, nil, ""},
		{"unreadable", pooled, []byte{0, 0, 0, 9, 0, 3, 0, 0, 'x'}, nil, nil, ""},
	} {
		got := tc.srv.checkStartup(tc.in)
		want := tc.out
		if want == nil {
			want = tc.in
		}
		if string(got.packet) != string(want) || !slices.Equal(got.tokens, tc.tokens) || got.internal != tc.internal {
			t.Errorf("%s: checkStartup = %q, %+v, %q; want %q, %+v, %q", tc.name, got.packet, got.tokens, got.internal, want, tc.tokens, tc.internal)
		}
	}
}

func TestInsertOrigin(t *testing.T) {
	// "SET;" (4 characters) put in front of "SELECT é; COMMIT; SELECT x" and
	// after "COMMIT;".
	sql := "SELECT é; COMMIT; SELECT x"
	o := insertOrigin{sql: sql, at: []int{0, len("SELECT é; COMMIT;")}, chars: 4, bytes: 4}
	c := &Client{}
	for _, tc := range []struct{ pos, want int }{
		{1, 0}, {4, 0}, // in the first statement of the proxy's
		{5, 1}, {12, 8}, // S of SELECT, é
		{21, 17},         // the ; after COMMIT
		{22, 0}, {25, 0}, // in the second
		{26, 18}, {34, 26}, // the space before SELECT x, x
	} {
		if got := o.Position(c, tc.pos, nil); got != tc.want {
			t.Errorf("Position(%d) = %d, want %d", tc.pos, got, tc.want)
		}
	}
}
