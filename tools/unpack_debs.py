#!/usr/bin/env python3
"""Unpack Debian packages (.deb) into a folder, like `dpkg-deb -x` for each, with Python's
standard library alone (a .deb is an `ar` archive holding data.tar.{xz,zst,gz,bz2}).

Used by tools/devdeps.sh on machines that have no dpkg-deb (or where unpacking into / must be
avoided): the files land under DEST/usr/..., nothing is installed or configured.

    tools/unpack_debs.py DEST FILE.deb [FILE.deb ...]
"""
import io
import os
import sys
import tarfile


def ar_members(data):
    if data[:8] != b"!<arch>\n":
        raise ValueError("not an ar archive")
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        yield name, data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)


def unpack(deb, dest):
    with open(deb, "rb") as f:
        data = f.read()
    for name, body in ar_members(data):
        if not name.startswith("data.tar"):
            continue
        if name.endswith(".zst"):
            try:
                import zstandard  # not in the standard library
            except ImportError:
                raise SystemExit(f"unpack_debs: {deb}: {name} needs zstd (pip zstandard)")
            body = zstandard.ZstdDecompressor().decompress(body, max_output_size=1 << 31)
            mode = "r:"
        else:
            mode = "r:*"
        with tarfile.open(fileobj=io.BytesIO(body), mode=mode) as tar:
            for m in tar.getmembers():
                # Paths inside are ./usr/...; refuse anything that would leave dest.
                target = os.path.realpath(os.path.join(dest, m.name))
                if not target.startswith(os.path.realpath(dest) + os.sep) and \
                        target != os.path.realpath(dest):
                    raise SystemExit(f"unpack_debs: {deb}: unsafe path {m.name}")
            if hasattr(tarfile, "tar_filter"):  # Python >= 3.12 (and security backports)
                tar.extractall(dest, filter="tar")  # keeps the packages' absolute symlinks
            else:
                tar.extractall(dest)
        return
    raise SystemExit(f"unpack_debs: {deb}: no data.tar member")


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    dest = argv[1]
    os.makedirs(dest, exist_ok=True)
    for deb in argv[2:]:
        unpack(deb, dest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
