#!/usr/bin/env bash
# The documentation against the code (README.md and docs/*.md):
#  (a) docs/config.md is what `tetra docs config` prints now (the reference is generated
#      from the schema, so a key added, removed or changed makes this fail until the page
#      is generated again), and every key has its help text;
#  (b) every config key the pages name (`section.key` in backticks and code blocks, keys
#      under a section of a YAML block, the key of every --set, whatever its section) is a
#      key of that reference;
#  (c) every `tetra ...` command example parses: its command exists (`tetra CMD --help`
#      exits 0), each --option it uses is in that help, a subcommand (tokenizer train,
#      data prepare, trace merge) is in it too; `tetra run` / `tetra -i` take only --set;
#      every recipes/, tools/, tests/ and docs/ path the pages name exists, and so does
#      every relative link.
# Usage: bash docs.sh /path/to/tetra
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# (a)
"$tetra" docs config >"$tmp/config.md" 2>"$tmp/err" || fail "tetra docs config: $(cat "$tmp/err")"
diff -u docs/config.md "$tmp/config.md" >"$tmp/diff" ||
  { cat "$tmp/diff"; fail "docs/config.md differs from the schema: regenerate it with \`build/tetra docs config > docs/config.md\`"; }
n=$(grep -c '^| `[a-z_]*\.[a-z0-9_]*` |' docs/config.md)
[ "$n" -gt 100 ] || fail "docs/config.md lists only $n keys"
bare=$(grep '^| `.*|  |$' docs/config.md | cut -d'`' -f2 | tr '\n' ' ')
[ -z "$bare" ] || fail "keys without help text: $bare(give their specs a doc)"
echo "ok: docs/config.md is the schema's ($n keys)"

# (b) and (c)
"${PYTHON:-python3}" - "$tetra" README.md docs/*.md <<'EOF' || exit 1
import os, re, shlex, subprocess, sys

tetra, pages = sys.argv[1], sys.argv[2:]
keys = set(re.findall(r"^\| `([a-z_]+\.[a-z0-9_]+)` \|", open("docs/config.md").read(), re.M))
sections = {k.split(".")[0] for k in keys}
problems = []
def problem(where, msg): problems.append(f"{where}: {msg}")

# `section.key` not inside a longer dotted name (cfg.model.dim, tetra.data) and not a file
# (data.lua, model.safetensors) or an indexed module path (model.layers[1]).
FILE_EXT = {"lua", "md", "c", "h", "cu", "json", "jsonl", "yaml", "yml", "safetensors", "bin",
            "txt", "py", "sh", "tok", "png", "gp", "dat", "log", "tfrecord", "so"}
KEY = re.compile(r"(?<![\w./-])(" + "|".join(sorted(sections)) + r")\.([a-z][a-z0-9_]*)(?![\w\[(:]|\.\w)")
SET = re.compile(r"--set[ =]+['\"]?([\w.]+)=")
def check_keys(text, where):
    for m in SET.finditer(text):                          # any section, known or not
        k = m.group(1)                                    # (key=value, section.key=value:
        if "." in k and k != "section.key" and k not in keys:   # the syntax, not a key)
            problem(where, f"--set of an unknown key '{k}'")
    for m in KEY.finditer(text):
        if m.group(2) in FILE_EXT: continue
        k = m.group(1) + "." + m.group(2)
        if k not in keys: problem(where, f"unknown config key '{k}' (not in docs/config.md)")

PATH = re.compile(r"(?<![\w./-])((?:recipes|tools|tests|docs)/[\w./+-]*[\w+-])")
def check_paths(text, where):
    for m in PATH.finditer(text):
        p = m.group(1)
        if not os.path.exists(p): problem(where, f"no such path '{p}'")

help_cache = {}
def help_text(cmd):
    if cmd not in help_cache:
        r = subprocess.run([tetra, cmd, "--help"], capture_output=True, text=True)
        help_cache[cmd] = r.stdout + r.stderr if r.returncode == 0 else None
    return help_cache[cmd]

def placeholder(w): return w == "..." or re.fullmatch(r"[A-Z][A-Z0-9_.]*", w) is not None

checked = []
def check_command(words, where):
    checked.append(words)
    cmd = " ".join(words)
    if not words: return                                   # the bare REPL
    sub, args = words[0], words[1:]
    if sub in ("--help", "-h", "--version", "-e") or placeholder(sub): return
    if sub in ("run", "-i", "test"):
        i = 0
        while i < len(args):
            a = args[i]
            if a in ("--set", "-s") and sub != "test": i += 2; continue
            if a.startswith("-"): problem(where, f"`tetra {sub}` has no option {a}: {cmd}")
            i += 1
        return
    text = help_text(sub)
    if text is None:
        problem(where, f"`tetra {sub} --help` fails: unknown command in: {cmd}"); return
    for a in args:
        o = re.match(r"(--[a-z][a-z0-9-]*)", a)
        if o and o.group(1) != "--help" and o.group(1) not in text:
            problem(where, f"`tetra {sub}` has no option {o.group(1)} (not in its --help): {cmd}")
    if sub in ("tokenizer", "data", "trace") and args and not args[0].startswith("-"):
        if not placeholder(args[0]) and f"tetra {sub} {args[0]}" not in text:
            problem(where, f"`tetra {sub}` has no subcommand '{args[0]}': {cmd}")

# A command line as the shell splits it, comments dropped: from the word `tetra` (or a
# path ending in /tetra) on, to a pipe, a redirection or `--` (tetra launch ... -- CMD,
# whose own tetra command is checked in turn).
def commands_in(line):
    try:
        words = shlex.split(line.replace("\\\n", " "), comments=True)
    except ValueError:
        words = line.split()
    out = []
    for i, w in enumerate(words):
        if w == "tetra" or w.endswith("/tetra"):
            rest = []
            for x in words[i + 1:]:
                if x in ("|", "&&", ";", "--") or re.match(r"\d?>", x): break
                rest.append(x)
            out.append(rest)
    return out

for page in pages:
    lines = open(page, encoding="utf-8").read().split("\n")
    in_code, lang, section, buf = False, "", None, ""
    for n, line in enumerate(lines, 1):
        where = f"{page}:{n}"
        if line.startswith("```"):
            in_code, lang, section = not in_code, line[3:].strip(), None
            continue
        if in_code:
            if lang in ("yaml", "yml"):
                m = re.match(r"^([a-z_]+):\s*(#.*)?$", line)
                if m: section = m.group(1) if m.group(1) in sections else None; continue
                m = re.match(r"^\s+([a-z_][a-z0-9_]*):", line)
                if m and section and f"{section}.{m.group(1)}" not in keys:
                    problem(where, f"unknown config key '{section}.{m.group(1)}' (YAML block)")
                continue
            check_keys(line, where)
            check_paths(line, where)
            if lang not in ("", "sh", "bash"): continue      # output, diagrams
            # Continued lines (a trailing backslash) are one command.
            buf += line.rstrip("\\") + " "
            if line.endswith("\\"): continue
            for words in commands_in(buf): check_command(words, where)
            buf = ""
            continue
        for span in re.findall(r"`([^`]+)`", line):
            check_keys(span, where)
            check_paths(span, where)
            if re.match(r"(build/)?tetra( |$)", span):
                for words in commands_in(span): check_command(words, where)
        for target in re.findall(r"\]\(([^)#\s]+)\)", line):
            if not re.match(r"[a-z]+:", target) and \
               not os.path.exists(os.path.join(os.path.dirname(page), target)):
                problem(where, f"broken link '{target}'")

for p in problems: print("FAIL:", p)
if problems:
    print(f"{len(problems)} problems in the documentation")
    sys.exit(1)
if len(checked) < 40: print(f"FAIL: only {len(checked)} tetra commands found"); sys.exit(1)
print(f"ok: {len(pages)} pages: every config key in docs/config.md, all {len(checked)} tetra " +
      f"commands parse ({', '.join(sorted(help_cache))} checked against --help), every path exists")
EOF
echo "PASS docs"
