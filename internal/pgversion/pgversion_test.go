package pgversion_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/pgfence/pgfence/internal/pgversion"
)

func TestVersion(t *testing.T) {
	for _, c := range []struct {
		v                      pgversion.Version
		major                  int
		name                   string
		supported, params, new bool
	}{
		{90624, 9, "PostgreSQL 9.6.24", false, false, false},
		{130023, 13, "PostgreSQL 13.23", false, false, false},
		{140000, 14, "PostgreSQL 14.0", true, false, false},
		{140023, 14, "PostgreSQL 14.23", true, false, false},
		{150018, 15, "PostgreSQL 15.18", true, true, false},
		{180004, 18, "PostgreSQL 18.4", true, true, false},
		{190001, 19, "PostgreSQL 19.1", true, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := c.v.Major(); got != c.major {
				t.Errorf("Major() = %d, want %d", got, c.major)
			}
			if got := c.v.String(); got != c.name {
				t.Errorf("String() = %q, want %q", got, c.name)
			}
			if got := c.v.HasParameterPrivileges(); got != c.params {
				t.Errorf("HasParameterPrivileges() = %v, want %v", got, c.params)
			}
			if got := c.v.HasMerge(); got != c.params {
				t.Errorf("HasMerge() = %v, want %v", got, c.params)
			}
			if got := c.v.Untested(); got != c.new {
				t.Errorf("Untested() = %v, want %v", got, c.new)
			}
			err := c.v.Supported()
			if (err == nil) != c.supported {
				t.Fatalf("Supported() = %v, want supported %v", err, c.supported)
			}
			if err == nil {
				return
			}
			// The refusal names the version, what is supported, and what
			// to do; wrapped, it is still told apart.
			for _, want := range []string{c.name, fmt.Sprint(int(c.v)), "supports PostgreSQL 14 to 18", "upgrade the server to PostgreSQL 14 or later"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Supported() = %q, want it to say %q", err, want)
				}
			}
			if !pgversion.IsUnsupported(fmt.Errorf("starting: %w", err)) {
				t.Errorf("IsUnsupported(wrapped %v) = false", err)
			}
		})
	}
	if pgversion.IsUnsupported(errors.New("PostgreSQL 13")) {
		t.Error("IsUnsupported of another error = true")
	}
}
