#!/usr/bin/env python3
"""The NVIDIA Vulkan driver's machine code (SASS) of our kernels, from its shader disk cache.

On the GPU machine:
  __GL_SHADER_DISK_CACHE=1 __GL_SHADER_DISK_CACHE_PATH=/tmp/glc __GL_SHADER_DISK_CACHE_SKIP_CLEANUP=1 \
  SWITCHBOARD_LOG=info SWITCHBOARD_PIPELINE_STATS=1 switchboard bench model ... 2> /tmp/stats.log
  bench/nv_sass.py /tmp/glc OUT_DIR --stats /tmp/stats.log [--arch SM90]

The cache holds zstd frames; a frame that starts with "NVDANVVM" is one compiled pipeline whose
code section (size and offset at words 19 and 20 of its header, the code 8 bytes past the offset)
is raw SASS. Each is written to OUT_DIR/<name or code size>.sass.bin and, where nvdisasm is found
(CUDA toolkit), disassembled into .txt beside it. With --stats, a code size is named by the kernel
whose "Binary Size" statistic (vk_runtime.cpp log_pipeline_stats) equals it. Diagnostics only:
the container layout is the driver's, undocumented, read from what driver 580 writes.
"""
import argparse
import glob
import os
import re
import shutil
import struct
import subprocess
import sys

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def decompress(frame):
    try:
        import zstandard  # noqa: PLC0415 (optional)
        return zstandard.ZstdDecompressor().decompressobj().decompress(frame)
    except ImportError:
        r = subprocess.run(["zstd", "-d", "-c", "-q"], input=frame, capture_output=True)
        return r.stdout


def frames(data):
    offs = []
    o = data.find(ZSTD_MAGIC)
    while o >= 0:
        offs.append(o)
        o = data.find(ZSTD_MAGIC, o + 4)
    for i, o in enumerate(offs):
        yield data[o:offs[i + 1] if i + 1 < len(offs) else len(data)]


def names_by_size(stats_log):
    names = {}
    for line in open(stats_log, errors="replace"):
        m = re.search(r"pipeline (\S+) \[\d+\] Binary Size = (\d+)", line)
        if m:
            names.setdefault(int(m.group(2)), set()).add(m.group(1).split("#")[0])
    return {size: "+".join(sorted(n)) for size, n in names.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--stats", help="a SWITCHBOARD_PIPELINE_STATS=1 log: names code sizes")
    ap.add_argument("--arch", default="SM90")
    args = ap.parse_args()
    names = names_by_size(args.stats) if args.stats else {}
    nvdisasm = shutil.which("nvdisasm", path=os.environ.get("PATH", "") + os.pathsep + "/usr/local/cuda/bin")
    os.makedirs(args.out_dir, exist_ok=True)
    seen = {}
    for path in sorted(glob.glob(os.path.join(args.cache_dir, "**", "*.bin"), recursive=True)):
        for frame in frames(open(path, "rb").read()):
            d = decompress(frame)
            if not d.startswith(b"NVDANVVM") or len(d) < 84:
                continue
            size, off = struct.unpack_from("<2I", d, 19 * 4)
            code = d[off + 8:off + 8 + size]
            if len(code) != size or size == 0:
                continue
            base = names.get(size, f"code{size}")
            seen[base] = seen.get(base, 0) + 1
            stem = os.path.join(args.out_dir, base if seen[base] == 1 else f"{base}.{seen[base]}")
            open(stem + ".sass.bin", "wb").write(code)
            if nvdisasm:
                with open(stem + ".txt", "w") as out:
                    subprocess.run([nvdisasm, "-b", args.arch, stem + ".sass.bin"], stdout=out, stderr=subprocess.STDOUT)
            print(f"{stem}: {size} bytes", file=sys.stderr)
    if not seen:
        sys.exit("no compiled pipelines found under " + args.cache_dir)


if __name__ == "__main__":
    main()
