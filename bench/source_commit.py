"""Which commit made a result: the commit whose sources hash to the result's source_sha256.

A result names its code twice: `commit`, the checkout's HEAD (with '+dirty' for local edits),
and `source_sha256`, a digest of the code itself (`results.source_digest`). Where a tree was
copied to another machine with older git metadata (the GPU machine keeps a session's first
HEAD), `commit` names that HEAD and only the digest names the code: this finds the commit of
the repository's recent history whose tree hashes to it.

    python bench/source_commit.py bench/results/run-h200.json [more results or digests]
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path, PurePosixPath

from script import run_script

from pdmux_triton.cli.parsing import Parser, integer
from pdmux_triton.errors import PdmuxError
from pdmux_triton.results import SOURCE_FOLDERS, SOURCE_SUFFIXES, digest_sources, read_json

DIGEST = re.compile(r"[0-9a-f]{64}")


def _git(repo: Path, *args: str, stdin: bytes | None = None) -> bytes:
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True,
                             timeout=120)
    except (OSError, subprocess.SubprocessError) as err:
        raise PdmuxError(f"git could not run in {repo}: {err}") from None
    if out.returncode != 0:
        raise PdmuxError(f"{repo} is not a git repository with a history to search "
                         f"(git {args[0]}: {out.stderr.decode().strip()})")
    return out.stdout


class Blobs:
    """Blob contents by object id, through one `git cat-file --batch`."""

    def __init__(self, repo: Path):
        self.proc = subprocess.Popen(["git", "-C", str(repo), "cat-file", "--batch"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def read(self, oid: str) -> bytes:
        self.proc.stdin.write(oid.encode() + b"\n")
        self.proc.stdin.flush()
        header = self.proc.stdout.readline().split()
        size = int(header[2])
        data = self.proc.stdout.read(size)
        self.proc.stdout.read(1)  # the newline after the contents
        return data

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def commit_digest(repo: Path, commit: str, blobs: Blobs) -> str:
    """`results.source_digest` of a commit's tree, read from git."""
    listing = _git(repo, "ls-tree", "-r", "-z", commit, "--", *SOURCE_FOLDERS).split(b"\0")
    files: dict[str, list] = {folder: [] for folder in SOURCE_FOLDERS}
    for entry in filter(None, listing):
        meta, path = entry.decode().split("\t", 1)
        kind, oid = meta.split()[1:3]
        if kind == "blob" and PurePosixPath(path).suffix in SOURCE_SUFFIXES:
            files[path.split("/", 1)[0]].append((PurePosixPath(path), oid))
    # each folder in turn, its files in path order, as the checkout's digest walks them
    return digest_sources((str(path), blobs.read(oid)) for folder in SOURCE_FOLDERS
                          for path, oid in sorted(files[folder]))


def wanted(item: str) -> tuple[str, str]:
    """(what the user named, the digest): a digest as it is, or a result file's source_sha256."""
    if DIGEST.fullmatch(item):
        return item, item
    data = read_json(item, "result file")
    digest = data.get("source_sha256")
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise PdmuxError(f"{item} carries no source_sha256 (a result file of this tool, or a "
                         f"64-hex-digit digest, is needed)")
    return item, digest


def run(args) -> int:
    items = [wanted(item) for item in args.results]
    repo = Path(args.repo)
    commits = [line[:90] for line in _git(repo, "log", f"--max-count={args.max_commits}",
                                          "--format=%h %cs %s", "--all").decode().splitlines()]
    digests = {digest for _, digest in items}
    found: dict[str, list[str]] = {digest: [] for digest in digests}  # newest first
    blobs = Blobs(repo)
    try:
        for line in commits:
            digest = commit_digest(repo, line.split(" ", 1)[0], blobs)
            if digest in digests:
                found[digest].append(line)
    finally:
        blobs.close()
    for item, digest in items:
        lines = found[digest]
        if not lines:
            print(f"{item}: no commit of the last {len(commits)} (git log --all) has its sources")
        elif len(lines) == 1:
            print(f"{item}: {lines[0]}")
        else:  # commits that changed nothing under the sources share its digest
            print(f"{item}: {lines[-1]} (the first with these sources; the last: {lines[0]})")
    return 0 if all(found.values()) else 1


def main(argv=None) -> int:
    p = Parser(prog="bench/source_commit.py", description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", help="result files (JSON with source_sha256) or "
                   "digests")
    p.add_argument("--repo", default=str(Path(__file__).resolve().parent.parent))
    p.add_argument("--max-commits", type=integer(1, 100_000), default=300)
    return run_script(p, run, argv)


if __name__ == "__main__":
    sys.exit(main())
