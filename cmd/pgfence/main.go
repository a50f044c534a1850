// Command pgfence is a Postgres proxy that fences stale lease holders'
// writes: see README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// commit is the commit the build was made from, set at build time like
// version (-X main.commit=...); "" falls back to what the toolchain
// recorded (see buildCommit).
var commit = ""

func main() {
	// Commands handle signals themselves: serve drains on SIGTERM.
	if err := rootCmd().ExecuteContext(context.Background()); err != nil {
		if !errors.Is(err, errRefused) {
			fmt.Fprintln(os.Stderr, "pgfence:", err)
		}
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "pgfence",
		Short:         "A Postgres proxy that keeps stale lease holders from writing",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCmd(), demoCmd(), rewriteCmd(), initCmd(), uninstallCmd(), versionCmd())
	return root
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print pgfence's version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "pgfence", buildVersion(), "commit", buildCommit(), runtime.Version())
		},
	}
}
