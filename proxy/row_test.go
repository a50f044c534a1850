package proxy

import (
	"bytes"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// decodeRow reads what pgproto3 encodes, and refuses what is cut short.
func TestDecodeRow(t *testing.T) {
	want := [][]byte{[]byte("42"), nil, {}, []byte("1")}
	msg, err := (&pgproto3.DataRow{Values: want}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	body := msg[5:]
	got, err := decodeRow(body, nil)
	if err != nil || len(got) != len(want) {
		t.Fatalf("decodeRow = %q, %v", got, err)
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) || (got[i] == nil) != (want[i] == nil) {
			t.Errorf("value %d = %q, want %q", i, got[i], want[i])
		}
	}
	for cut := range len(body) {
		if _, err := decodeRow(body[:cut], nil); err == nil {
			t.Errorf("a row cut to %d of %d bytes decoded", cut, len(body))
		}
	}
}
