# SPDX-License-Identifier: BSD-3-Clause
"""The man pages say what the programs and the header say, and render cleanly.

Pages are generated at build time (tools/man/gen_man.sh); this reads them
back as a reader would, so an escaping slip (a line starting with '.', a
backslash, a hyphen) or a help text the generator mangles fails here:
  - groff -ww (every warning) and `man -l` render each page with no message;
  - snapsmp(1), snaptool(1) and snapbench(1), rendered, hold every line of
    `--help` (and of each `snaptool COMMAND --help`, `snapbench BENCHMARK
    --help`) verbatim, in order;
  - libsnap(3), rendered, holds every comment paragraph and every
    declaration line of the public headers, parsed here independently;
  - the gzipped copies that get installed are the same pages;
  - the generator keeps a help text with roff's special characters (lines
    starting with '.' or "'", backslashes, hyphens) verbatim too.
usage: check_man.py MAN_DIR GEN_MAN SNAPSMP SNAPTOOL SNAPBENCH HEADER...
"""
import gzip
import os
import re
import subprocess
import sys
import tempfile

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def render(page):
    r = subprocess.run(["groff", "-man", "-Tascii", "-P-cbou", page], capture_output=True, text=True)
    return r.stdout.splitlines()


def check_clean(page):
    r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", page], capture_output=True, text=True)
    if r.returncode or r.stderr.strip():
        fail(f"groff -ww {page}: exit {r.returncode}: {r.stderr.strip()}")
    env = dict(os.environ, MANWIDTH="80", MANPAGER="cat", PAGER="cat", LANG="C.UTF-8")
    r = subprocess.run(["man", "--warnings", "-l", page], capture_output=True, text=True, env=env)
    if r.returncode or r.stderr.strip() or len(r.stdout) < 200:
        fail(f"man -l {page}: exit {r.returncode}, {len(r.stdout)} bytes out: {r.stderr.strip()}")
    with open(page, "rb") as f, gzip.open(page + ".gz") as g:
        if f.read() != g.read():
            fail(f"{page}.gz is not {page}")


def holds_block(lines, block, what):
    """`block` appears in `lines` verbatim, every line shifted by one indent."""
    block = [b.rstrip() for b in block]
    while block and not block[0]:
        block.pop(0)
    first = block[0]
    for i, line in enumerate(lines):
        if line.rstrip().endswith(first) and line[: len(line.rstrip()) - len(first)].strip() == "":
            indent = " " * (len(line.rstrip()) - len(first))
            got = [x.rstrip() for x in lines[i : i + len(block)]]
            want = [(indent + b).rstrip() if b else "" for b in block]
            if got == want:
                return True
    fail(f"{what}: not found verbatim in the rendered page (first line: {first!r})")
    return False


def help_of(prog, *args):
    return subprocess.run([prog, *args, "--help"], capture_output=True, text=True, check=True).stdout.splitlines()


def check_help_page(page, prog, name):
    lines = render(page)
    text = help_of(prog)
    usage = text[0].removeprefix("usage: ")
    holds_block(lines, [usage], f"{name}(1) SYNOPSIS")
    holds_block(lines, text[1:], f"{name} --help")
    n = 1
    cmds, on = [], False
    for t in text:
        if t.startswith("commands:"):
            on = True
        elif on and not t.strip():
            break
        elif on:
            cmds.append(re.split(r"  +", t.strip())[0])
    for c in cmds:
        holds_block(lines, help_of(prog, *c.split()), f"{name} {c} --help")
        n += 1
    print(f"{name}({page[-1]}): {n} --help texts verbatim")


def norm(s):
    return " ".join(s.split())


def check_header_page(page, headers):
    rendered = norm(" ".join(render(page)))
    rendered_lines = {norm(x) for x in render(page)}
    paras = decls = 0
    for h in headers:
        src = open(h).read().splitlines()
        i = 0
        while i < len(src):
            line = src[i]
            if "SPDX-License-Identifier" in line:
                i += 1
                continue
            if line.startswith("/*"):
                body = []
                if line.rstrip().endswith("*/"):
                    body.append(line.strip()[2:-2])
                else:
                    i += 1
                    while not src[i].lstrip().startswith("*/"):
                        body.append(re.sub(r"^ \* ?|^ \*$", "", src[i]))
                        i += 1
                para = []
                for b in body + [""]:
                    if b.strip():
                        para.append(b)
                        continue
                    if para:
                        p = norm(" ".join(para))
                        if re.match(r"snap/\w+\.h - ", p):   # the NAME line / a section opener
                            p = re.sub(r"^snap/\w+\.h - ", "", p).rstrip(".")
                        if p.lower() not in rendered.lower():
                            fail(f"libsnap(3) lacks this comment of {os.path.basename(h)}: {p[:90]!r}")
                        paras += 1
                    para = []
                i += 1
                continue
            s = line.strip()
            skip = (not s or s.startswith(("#ifndef", "#ifdef", "#endif", "#include", 'extern "C"'))
                    or re.fullmatch(r"#define SNAP_[A-Z]+_H", s) or s == "}" and src[i - 1].startswith("extern"))
            if not skip and norm(s) not in rendered_lines:
                fail(f"libsnap(3) lacks this line of {os.path.basename(h)}: {s!r}")
            elif not skip:
                decls += 1
            i += 1
    print(f"libsnap(3): {paras} comment paragraphs and {decls} declaration lines of the headers present")


TRICKY_HELP = r"""usage: tricky [-x] FILE
Print a help text that roff would eat if it were not escaped.
.SH not a heading
'not a request either
  back\slash \fB not bold \-\- and -- --dash \e
\" not a comment
  -q, --quiet    as usual"""


def check_generator(gen):
    with tempfile.TemporaryDirectory() as t:
        prog = os.path.join(t, "tricky")
        with open(prog, "w") as f:
            f.write("#!/bin/sh\ncat <<'EOF'\n" + TRICKY_HELP + "\nEOF\n")
        os.chmod(prog, 0o755)
        page = os.path.join(t, "tricky.1")
        subprocess.run(["bash", gen, "help", "tricky", prog, "0", page], check=True)
        subprocess.run(["gzip", "-kn", page], check=True)
        check_clean(page)
        check_help_page(page, prog, "tricky")


def main():
    mandir, gen, snapsmp, snaptool, snapbench = sys.argv[1:6]
    headers = sys.argv[6:]
    check_generator(gen)
    pages = {p: os.path.join(mandir, p) for p in ("snapsmp.1", "snaptool.1", "snapbench.1", "libsnap.3")}
    for page in pages.values():
        check_clean(page)
    check_help_page(pages["snapsmp.1"], snapsmp, "snapsmp")
    check_help_page(pages["snaptool.1"], snaptool, "snaptool")
    check_help_page(pages["snapbench.1"], snapbench, "snapbench")
    check_header_page(pages["libsnap.3"], headers)
    if failures:
        sys.exit(f"{len(failures)} failures")


main()
