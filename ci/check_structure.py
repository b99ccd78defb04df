#!/usr/bin/env python3
"""Structure checks CI runs (docs/architecture.md):
- layering: every #include of a project header in a layer's folder names a header of that
  layer or of a layer it may use (an include that names no project header is a library's). The build's per-layer include paths enforce the same rules;
  this states them in one table and catches what a path cannot (a relative path, say);
- size: no source file over 800 lines in the library's folders, no shader over 600;
- families: every metal_shaders/<family>.comp has its GPU host file backend/gpu/<family>.cpp.
Exit 1 on any finding."""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PUBLIC = "backend/include"
# layer folder -> the folders its files may include from (besides its own)
ALLOWED = {
    PUBLIC: [],
    "backend/core": [PUBLIC],
    "backend/ops": ["backend/core", PUBLIC],
    "backend/src": ["backend/ops", "backend/core", PUBLIC],
    "cpu_fallback": ["backend/ops", "backend/core", PUBLIC],
    "backend/gpu": ["backend/ops", "backend/core", PUBLIC, "metal_shaders"],
    "backend/vulkan": ["backend/gpu", "backend/ops", "backend/core", PUBLIC, "metal_shaders"],
    "backend/metal": ["backend/gpu", "backend/ops", "backend/core", PUBLIC, "metal_shaders"],
    "backend/devices": ["cpu_fallback", "backend/vulkan", "backend/metal", "backend/core", PUBLIC],
    "backend/models": ["backend/ops", "backend/core", PUBLIC],
    "backend/cli": ["backend/ops", "backend/core", PUBLIC],
    "metal_shaders": [],
}
GENERATED = {"program_generated.h", "op_info_generated.inc", "kernel_list.inc"}  # build/*/generated, for core and above
SOURCE_EXT = (".h", ".cpp", ".mm", ".comp", ".glsl", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s+["<]([^">]+)[">]')


def layer_of(path):
    best = None
    for layer in ALLOWED:
        if path == layer or path.startswith(layer + "/"):
            if best is None or len(layer) > len(best):
                best = layer
    return best


def main():
    headers = {}  # (layer, include spelling) -> True: what each layer's folder holds
    files = []
    for layer in ALLOWED:
        for dirpath, _, names in os.walk(os.path.join(ROOT, layer)):
            for name in names:
                rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
                if layer_of(rel) != layer or not name.endswith(SOURCE_EXT):
                    continue
                files.append((rel, layer))
                base = os.path.join(ROOT, layer)
                headers[(layer, os.path.relpath(os.path.join(dirpath, name), base))] = True
    bad = []
    for rel, layer in files:
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                if ".." in inc.split("/"):
                    bad.append(f"{rel}:{lineno}: #include \"{inc}\" climbs out of its folder; name the header itself")
                    continue
                if inc in GENERATED and layer not in (PUBLIC, "metal_shaders"):
                    continue
                # Resolved as the build does: the layer's own folder first, then those it may use.
                if any((l, inc) in headers for l in [layer] + ALLOWED[layer]):
                    continue
                target = next((l for l in ALLOWED if (l, inc) in headers), None)
                if target is None:
                    continue  # not a project header: the standard library or a dependency
                where = f"the {target} layer"
                bad.append(f"{rel}:{lineno}: #include \"{inc}\" is in {where}; {layer} may include "
                           f"{', '.join([layer] + ALLOWED[layer])}")
    crossings = len(bad)
    for rel, _ in files:
        limit = 600 if rel.endswith((".comp", ".glsl")) else 800
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > limit:
            bad.append(f"{rel}: {n} lines (limit {limit})")
    shaders = sorted(os.path.splitext(n)[0] for n in os.listdir(os.path.join(ROOT, "metal_shaders"))
                     if n.endswith(".comp"))
    for s in shaders:
        if not os.path.exists(os.path.join(ROOT, "backend/gpu", s + ".cpp")):
            bad.append(f"metal_shaders/{s}.comp: no GPU host file backend/gpu/{s}.cpp")
    for b in bad:
        print(b)
    print(f"check_structure: {len(files)} files, {crossings} layer crossings, {len(shaders)} shader families, "
          f"{len(bad) - crossings} other findings")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
