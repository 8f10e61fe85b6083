package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
)

// completionWords are the arguments each command completes besides its
// flags (job, team and node names are not known offline).
var completionWords = map[string][]string{
	"get":        {"jobs", "nodes", "teams"},
	"describe":   {"job", "team", "node"},
	"resize":     {"job"},
	"completion": {"bash", "zsh", "fish"},
	"simulate":   {"generate"},
}

func cmdCompletion(c *cli.Context) error {
	shell := c.Args().First()
	if c.Args().Len() != 1 {
		return usage(c, "completion needs the shell: bash, zsh or fish")
	}
	cmds := c.App.Commands
	var names []string
	flags := map[string][]string{}
	for _, cmd := range cmds {
		if cmd.Hidden {
			continue
		}
		names = append(names, cmd.Name)
		for _, f := range cmd.Flags {
			for _, n := range f.Names() {
				flags[cmd.Name] = append(flags[cmd.Name], dashed(n))
			}
		}
	}
	var global []string
	for _, f := range c.App.Flags {
		for _, n := range f.Names() {
			global = append(global, dashed(n))
		}
	}
	sort.Strings(names)
	w := c.App.Writer
	switch shell {
	case "bash":
		fmt.Fprintf(w, "# elasticctl bash completion: source <(elasticctl completion bash)\n_elasticctl() {\n")
		fmt.Fprintf(w, "  local cur=\"${COMP_WORDS[COMP_CWORD]}\" cmd=\"\" i\n")
		fmt.Fprintf(w, "  for ((i=1; i<COMP_CWORD; i++)); do case \"${COMP_WORDS[i]}\" in -*) ;; *) cmd=\"${COMP_WORDS[i]}\"; break;; esac; done\n")
		fmt.Fprintf(w, "  local words\n  case \"$cmd\" in\n")
		for _, n := range names {
			fmt.Fprintf(w, "    %s) words=%q;;\n", n, strings.Join(append(append([]string{}, completionWords[n]...), flags[n]...), " "))
		}
		fmt.Fprintf(w, "    *) words=%q;;\n  esac\n", strings.Join(append(append([]string{}, names...), global...), " "))
		fmt.Fprintf(w, "  COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n}\ncomplete -o default -F _elasticctl elasticctl\n")
	case "zsh":
		fmt.Fprintf(w, "#compdef elasticctl\n# elasticctl zsh completion: elasticctl completion zsh > \"${fpath[1]}/_elasticctl\"\n_elasticctl() {\n")
		fmt.Fprintf(w, "  local cmd=${words[2]}\n  if (( CURRENT == 2 )); then\n    compadd -- %s\n    return\n  fi\n  case $cmd in\n", strings.Join(names, " "))
		for _, n := range names {
			fmt.Fprintf(w, "    %s) compadd -- %s;;\n", n, strings.Join(append(append([]string{}, completionWords[n]...), flags[n]...), " "))
		}
		fmt.Fprintf(w, "  esac\n}\ncompdef _elasticctl elasticctl\n")
	case "fish":
		fmt.Fprintf(w, "# elasticctl fish completion: elasticctl completion fish > ~/.config/fish/completions/elasticctl.fish\n")
		fmt.Fprintf(w, "complete -c elasticctl -f\n")
		for _, cmd := range cmds {
			if cmd.Hidden {
				continue
			}
			fmt.Fprintf(w, "complete -c elasticctl -n __fish_use_subcommand -a %s -d %q\n", cmd.Name, cmd.Usage)
			if ws := completionWords[cmd.Name]; len(ws) > 0 {
				fmt.Fprintf(w, "complete -c elasticctl -n '__fish_seen_subcommand_from %s' -a %q\n", cmd.Name, strings.Join(ws, " "))
			}
			for _, f := range cmd.Flags {
				long := f.Names()[0]
				fmt.Fprintf(w, "complete -c elasticctl -n '__fish_seen_subcommand_from %s' -l %s\n", cmd.Name, long)
			}
		}
	default:
		return usage(c, "completion %q: choose bash, zsh or fish", shell)
	}
	return nil
}
