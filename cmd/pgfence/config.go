package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"
)

// loadConfigFile applies a YAML file's keys to the command's flags. Keys are
// the flag names; a flag given on the command line wins over the file.
// Lists (such as guard) may be YAML sequences.
// envPrefix starts the environment variable of each flag (see loadEnv).
const envPrefix = "PGFENCE_"

// envName is the environment variable that sets flag name:
// PGFENCE_UPSTREAM for --upstream, PGFENCE_METRICS_LISTEN for
// --metrics-listen.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// loadEnv sets each of cmd's flags that the command line did not from its
// environment variable (envName), if that is set: configuration that stays
// out of argv, such as an --upstream URL with a password. It runs before
// the config file, so flags win over the environment, and the environment
// over the file.
func loadEnv(cmd *cobra.Command) error {
	var err error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		v, ok := os.LookupEnv(envName(f.Name))
		if !ok || f.Changed || err != nil {
			return
		}
		// A list flag takes a comma-separated list, as in a config file.
		if e := setFlag(cmd.Flags(), f, v); e != nil {
			err = fmt.Errorf("%s: %w", envName(f.Name), e)
		}
	})
	return err
}

func loadConfigFile(cmd *cobra.Command, path string) error {
	return applyConfigFile(cmd, path, nil)
}

// applyConfigFile is loadConfigFile; a key cmd has no flag of, but that
// also says whether to skip it (a key of serve's that init and uninstall
// have no use for), is skipped.
func applyConfigFile(cmd *cobra.Command, path string, also func(key string) bool) error {
	if path == "" {
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	var raw map[string]any
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	if len(raw) == 0 {
		// A file caught while it is written (truncated first) reads as
		// no keys, and all defaults would drop every guard it names.
		return fmt.Errorf("config file %s has no keys: refused, as a file caught while being written reads so (give every setting its key, or leave --config out)", path)
	}
	flags := cmd.Flags()
	for key, v := range raw {
		f := flags.Lookup(key)
		if f == nil && key != "config" && also != nil && also(key) {
			continue
		}
		if f == nil || key == "config" {
			return fmt.Errorf("config file %s: unknown key %q (keys are the flag names of 'pgfence %s --help')", path, key, cmd.Name())
		}
		if f.Changed {
			continue
		}
		if err := setFlag(flags, f, v); err != nil {
			return fmt.Errorf("config file %s: key %q: %w", path, key, err)
		}
	}
	return nil
}

func setFlag(flags *pflag.FlagSet, f *pflag.Flag, v any) error {
	switch v := v.(type) {
	case []any:
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			items := make([]string, len(v))
			for i, x := range v {
				items[i] = fmt.Sprint(x)
			}
			return sv.Replace(items)
		}
		return fmt.Errorf("takes a single value, not a list")
	case nil:
		return nil
	default:
		s := fmt.Sprint(v)
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			if s == "" {
				return sv.Replace(nil)
			}
			return sv.Replace(strings.Split(s, ","))
		}
		return flags.Set(f.Name, s)
	}
}
