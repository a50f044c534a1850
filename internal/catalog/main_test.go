package catalog

import (
	"context"
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var ctx = context.Background()
