package leakybucket

import (
	"os"
	"strings"
	"testing"
)

// The README's quick start is the body of ExampleNew, which `go test` runs
// and checks: the two cannot drift apart.
func TestReadmeQuickStartIsExampleNew(t *testing.T) {
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(src), "func ExampleNew() {\n")
	if !ok {
		t.Fatal("example_test.go has no ExampleNew")
	}
	body, _, _ = strings.Cut(body, "\n}\n")
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "func main() {\n"+body+"\n}\n") {
		t.Errorf("README.md's quick start is not the body of ExampleNew:\n%s", body)
	}
}

// leastPrivilegeDoc is the README's least-privilege page: the commands a
// Bucket sends and the ACL SETUSER lines, which the README links.
const leastPrivilegeDoc = "docs/least-privilege.md"

// The least-privilege page is rendered from commands_test.go: its table of
// commands, the lock's commands, go-redis's connection commands and the ACL
// SETUSER lines. The test prints what to paste when they differ.
func TestReadmeLeastPrivilege(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "]("+leastPrivilegeDoc+")") {
		t.Errorf("README.md does not link %s", leastPrivilegeDoc)
	}
	doc, err := os.ReadFile(leastPrivilegeDoc)
	if err != nil {
		t.Fatal(err)
	}
	for _, part := range []struct{ name, text string }{
		{"table of commands", readmeCommandTable()},
		{"list of the lock's commands", readmeLockCommands()},
		{"commands of WithReplicas", readmeReplicaCommands()},
		{"table of connection commands", readmeConnTable()},
		{"ACL SETUSER lines", readmeACLLines()},
	} {
		if !strings.Contains(string(doc), part.text) {
			t.Errorf("%s lacks the %s of commands_test.go:\n%s", leastPrivilegeDoc, part.name, part.text)
		}
	}
}

// readmeCommand writes a command as the least-privilege page does:
// `CLIENT SETINFO`.
func readmeCommand(name string) string {
	return "`" + strings.ToUpper(strings.ReplaceAll(name, "|", " ")) + "`"
}

func readmeCommands(names []string) string {
	var out []string
	for _, n := range names {
		out = append(out, readmeCommand(n))
	}
	return strings.Join(out, ", ")
}

var readmeStrategies = map[string]string{"logs": "`Logs`", "sortedset": "`SortedSet`", "windows": "`Windows(p)`", "gcra": "`GCRA`"}

var readmeMethods = map[method]string{
	allowMethod:    "`Allow`, `AllowN`",
	peekMethod:     "`Peek`, `PeekN`",
	flushMethod:    "`Flush`",
	flushAllMethod: "`FlushAll`",
}

func readmeCommandTable() string {
	var b strings.Builder
	b.WriteString("| |")
	for _, s := range strategyNames {
		b.WriteString(" " + readmeStrategies[s] + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(strategyNames)) + "\n")
	for _, m := range methods {
		b.WriteString("| " + readmeMethods[m] + " |")
		for _, s := range strategyNames {
			sent := strategyCommands[s][m]
			cell := readmeCommands(sent.commands)
			if sent.lock {
				cell = "the lock, " + cell
			}
			if len(sent.onLoss) > 0 {
				cell += "; after a lost reply also " + readmeCommands(sent.onLoss)
			}
			if extra := clusterCommands[s][m]; len(extra) > 0 {
				cell += "; on a cluster also " + readmeCommands(extra)
			}
			b.WriteString(" " + cell + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}

func readmeLockCommands() string { return "The lock is " + readmeCommands(lockCommands) + "." }

func readmeReplicaCommands() string {
	var rules []string
	for _, c := range replicaCommands {
		rules = append(rules, "`+"+c+"`")
	}
	return "With `WithReplicas`, `Allow` and `AllowN` also send " + readmeCommands(replicaCommands) +
		", after each decision's `EXEC`: add " + strings.Join(rules, ", ") + " to the user's rules."
}

func readmeConnTable() string {
	var b strings.Builder
	b.WriteString("| go-redis sends | when | ACL rule |\n|---|---|---|\n")
	for _, c := range connCommands {
		rule := "none: every user may run it"
		if c.grant {
			rule = strings.TrimSuffix("`+"+strings.ReplaceAll(c.name, "|", `\|`)+"`, "+c.where, ", ")
		}
		b.WriteString("| " + readmeCommand(c.name) + " | " + c.when + " | " + rule + " |\n")
	}
	return b.String()
}

// readmeACLLines are one ACL SETUSER line per strategy, for the default
// prefix, on a standalone server or a cluster.
func readmeACLLines() string {
	var b strings.Builder
	b.WriteString("```\n")
	for _, s := range strategyNames {
		cmds := strategyCommandsAll(s, true)
		for _, c := range connCommands {
			if c.paste {
				cmds = append(cmds, c.name)
			}
		}
		b.WriteString("ACL SETUSER leakybucket-" + s + " on >change-this-password resetkeys ~" + defaultPrefix + ":* resetchannels " +
			strings.Join(aclRules(unique(cmds)), " ") + "\n")
	}
	b.WriteString("```\n")
	return b.String()
}
