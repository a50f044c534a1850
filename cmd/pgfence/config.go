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
func loadConfigFile(cmd *cobra.Command, path string) error {
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
	flags := cmd.Flags()
	for key, v := range raw {
		f := flags.Lookup(key)
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
		if _, ok := f.Value.(pflag.SliceValue); ok {
			return f.Value.(pflag.SliceValue).Replace(strings.Split(s, ","))
		}
		return flags.Set(f.Name, s)
	}
}
