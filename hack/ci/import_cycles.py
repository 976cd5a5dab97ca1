#!/usr/bin/env python3
"""File-level import graph of a Rust crate from its `crate::`/`super::` paths
(use lines and inline paths, comments and strings and a trailing
`#[cfg(test)] mod tests` left out; `crate::Name` re-exported by lib.rs
followed to its module); prints every cycle (strongly connected component).
Usage: import_cycles.py CRATE/src [--groups] [--check]
(--check: exit 1 when there is a cycle; hack/ci/test.sh holds the crates
that have none to it)."""
import os, re, sys
root = sys.argv[1]
files = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'):
            p = os.path.join(d, f); rel = os.path.relpath(p, root)[:-3]
            parts = rel.split(os.sep)
            if parts[-1] == 'mod': parts = parts[:-1]
            if parts == ['lib']: parts = []
            files[tuple(parts)] = os.path.relpath(p, root)
def strip(src):
    src = re.sub(r'//[^\n]*', '', src)
    src = re.sub(r'/\*.*?\*/', '', src, flags=re.S)
    src = re.sub(r'"(\\.|[^"\\])*"', '""', src)
    return src
def expand(s):
    # expand use-trees: a::{b, c::{d}} -> a::b, a::c::d
    s = s.replace(' ', '').replace('\n', '')
    m = re.match(r'^(.*?)\{(.*)\}$', s)
    if not m: return [s]
    pre, inner = m.groups(); out = []; depth = 0; cur = ''
    for ch in inner:
        if ch == '{': depth += 1
        if ch == '}': depth -= 1
        if ch == ',' and depth == 0: out.append(cur); cur = ''
        else: cur += ch
    if cur: out.append(cur)
    return [x for part in out for x in expand(pre + part)]
alias = {}
def load_aliases():
    src = strip(open(os.path.join(root, 'lib.rs')).read())
    for u in re.finditer(r'\bpub\s+use\s+([^;]*);', src):
        for p in expand(u.group(1)):
            segs = p.split('::')
            if segs[0] in ('crate', 'self'): segs = segs[1:]
            if segs and tuple(segs[:1]) in files or (segs and segs[0] in [k[0] for k in files if k]):
                alias[segs[-1]] = segs
def resolve(path, me):
    segs = path.split('::')
    if segs[0] == 'crate':
        segs = segs[1:]
        if segs and segs[0] in alias and (segs[0],) not in files:
            segs = alias[segs[0]] + segs[1:]
    elif segs[0] == 'super':
        base = list(me); 
        # file foo.rs is module foo; super is its parent
        while segs and segs[0] == 'super': base = base[:-1]; segs = segs[1:]
        segs = base + segs
    else: return None
    best = None
    for i in range(len(segs), 0, -1):
        if tuple(segs[:i]) in files: best = tuple(segs[:i]); break
    return best
load_aliases()
edges = {m: set() for m in files}
for m, f in files.items():
    src = strip(open(os.path.join(root, f)).read())
    src = re.sub(r'#\[cfg\(test\)\]\s*mod\s+tests\s*\{.*', '', src, flags=re.S)  # drop unit tests at end
    paths = []
    for u in re.finditer(r'\buse\s+((?:crate|super)::[^;]*);', src): paths += expand(u.group(1))
    for u in re.finditer(r'\b((?:crate|super)(?:::\w+)+)', src): paths.append(u.group(1))
    # paths into a child module (`use child::Item;`, `child::f()`)
    for u in re.finditer(r'(?<![:\w])(?:self::)?([a-z_][a-z0-9_]*)::', src):
        child = m + (u.group(1),)
        if child in files and u.group(1) not in ('crate', 'super', 'self'):
            paths.append('crate::' + '::'.join(child))
    for p in paths:
        t = resolve(p, m)
        if t is not None and t != m and t != ():
            edges[m].add(t)
# Tarjan
idx = {}; low = {}; st = []; on = set(); sccs = []; c = [0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in edges[v]:
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        sccs.append(comp)
for v in files:
    if v not in idx: sc(v)
cyc = [s for s in sccs if len(s) > 1]
name = lambda m: files[m]
print(f"{len(files)} files, {sum(len(e) for e in edges.values())} edges, {len(cyc)} cycle(s)")
for s in sorted(cyc, key=len, reverse=True):
    print(f"  cycle of {len(s)} files: " + ', '.join(sorted(name(m) for m in s)))
    for m in sorted(s):
        print(f"    {name(m)} -> " + ', '.join(sorted(name(t) for t in edges[m] if t in s)))
if '--groups' in sys.argv:
    g = lambda m: m[0] if len(m) > 1 or (m and files[m].endswith('mod.rs')) else '(root)'
    ge = {}
    for m, ts in edges.items():
        for t in ts:
            if g(m) != g(t): ge.setdefault(g(m), set()).add(g(t))
    for k in sorted(ge): print(f"  group {k} -> {', '.join(sorted(ge[k]))}")
sys.exit(1 if cyc and '--check' in sys.argv else 0)
