package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
)

var completionSpec = spec{name: "completion", args: "bash|zsh|fish", maxArgs: 1,
	short:     "print a shell's completion script",
	validArgs: []string{"bash", "zsh", "fish"},
	long: `Prints the completion script of a shell: commands, subcommands and flags complete with Tab.
  bash:  source <(tenure completion bash)
  zsh:   tenure completion zsh > "${fpath[1]}/_tenure"
  fish:  tenure completion fish > ~/.config/fish/completions/tenure.fish`}

// completionCmd is `tenure completion SHELL`.
type completionCmd struct {
	base
	root  *cobra.Command
	shell string
}

func (*completionCmd) define(*flagSet) {}

func (c *completionCmd) check(args []string) error {
	if len(args) != 1 {
		return usagef("name the shell: bash, zsh or fish")
	}
	switch c.shell = args[0]; c.shell {
	case "bash", "zsh", "fish":
		return nil
	}
	return usagef("shell %q is not bash, zsh or fish", c.shell)
}

func (c *completionCmd) run(context.Context) error {
	root := c.root
	switch c.shell {
	case "bash":
		return root.GenBashCompletionV2(c.stdout, true)
	case "zsh":
		return root.GenZshCompletion(c.stdout)
	case "fish":
		return root.GenFishCompletion(c.stdout, true)
	}
	return fmt.Errorf("no completion for %s", c.shell)
}
