#!/usr/bin/env python3
"""Every relative link in the repository's Markdown files resolves: the file exists inside the
repository, and a #fragment names a heading of it (GitHub's anchor rules). No link leaves the
repository. Usage: check_links.py [REPO_ROOT]; prints each broken link as FILE:LINE: and exits 1."""
import os, re, subprocess, sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../.."))
files = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
                       capture_output=True, text=True, check=True).stdout.split()
link = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path, cache={}):
    if path not in cache:
        seen, out, fence = {}, set(), False
        for line in open(path, encoding="utf-8"):
            if line.startswith("```"):
                fence = not fence
            if fence or not line.startswith("#"):
                continue
            text = line.lstrip("#").strip().lower()
            a = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
            n = seen.get(a, 0)
            seen[a] = n + 1
            out.add(a if n == 0 else f"{a}-{n}")
        cache[path] = out
    return cache[path]


bad = 0
for f in files:
    src = os.path.join(root, f)
    fence = False
    for no, line in enumerate(open(src, encoding="utf-8"), 1):
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        for target in link.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z]+:", target):
                continue  # http(s), mailto: not checked here
            path, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(src), path)) if path else src
            why = None
            if not (dest + os.sep).startswith(root + os.sep):
                why = "points outside the repository"
            elif not os.path.exists(dest):
                why = "no such file"
            elif frag and dest.endswith(".md") and frag not in anchors(dest):
                why = f"no heading #{frag} in {os.path.relpath(dest, root)}"
            if why:
                print(f"{f}:{no}: {target}: {why}")
                bad += 1
sys.exit(1 if bad else 0)
