"""Whether a data path a Punchcard client names stays under the server's allowed roots.

A string prefix check alone lets a symbolic link under a root (``/data/x -> /etc``, or a
link among a Parquet folder's part files) send Spark to read outside the roots, and the
trained model would then carry what it learned from that data back to the client. So a
local path (no scheme, or ``file:``) is also resolved, link by link, and so is every
entry of the folder Spark would list; URLs of other file systems (``hdfs://``,
``s3a://``) are checked by prefix only, as this server cannot see their links.

What this cannot prevent: a user who may write under a root swapping a link between the
check (at submission) and the job's read.
"""

import os
import re
import urllib.parse

from distkeras.errors import DistkerasError

# A URL scheme (RFC 3986) followed by ':', as Hadoop reads one.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")

# How many entries of a folder are resolved before the submission is refused: the check
# runs in a request thread, and a data folder of more files than this is unusual.
MAX_ENTRIES_CHECKED = 200_000


class OutsideRoots(DistkerasError, ValueError):
    """A path that resolves outside the allowed roots (its message says which entry)."""


# Without allowed roots, the file systems a job may read: a cluster's (Hadoop reads
# schemes in any case). An object store's bucket is no host to connect to (its endpoint is
# the cluster's setting); HDFS names its name node, so only the default one (hdfs:///).
CLUSTER_SCHEMES = ("hdfs", "s3a", "gs")
_HOSTLESS_SCHEMES = frozenset({"hdfs"})


def scheme(path):
    """The URL scheme of ``path`` in lower case (``"file"``, ``"hdfs"``), or None."""
    match = _SCHEME.match(path)
    return match.group(0)[:-1].lower() if match else None


def local_path(path):
    """The local file system path that ``path`` names, or None for another file system.

    Args:
        path: A path as Spark reads it: ``/a/b``, ``file:///a/b``, ``hdfs://nn/a``.
    """
    named = scheme(path)
    if named == "file":
        return urllib.parse.unquote(urllib.parse.urlparse(path).path)
    if named is not None:
        return None
    return path


def check_cluster_path(path):
    """Refuses a path that is not of a cluster file system `CLUSTER_SCHEMES` names (for
    a server with no allowed roots): local paths (no scheme, ``file:``, ``local:``,
    ``jar:file:``, in any case) and other schemes (``ftp:``, ``webhdfs:``, ``http:``),
    and an HDFS path naming a name node (Spark would connect to any host it names).

    Raises:
        OutsideRoots: Saying what this server reads.
    """
    named = scheme(path)
    accepted = (f"This server reads {', '.join(s + '://' for s in CLUSTER_SCHEMES)} paths "
                "only (hdfs:/// of the cluster's own name node): this server reads no "
                "local path, as its administrator named no folder of training data "
                "(punchcard --allowed-data-root, which may also name another name node).")
    if named not in CLUSTER_SCHEMES:
        raise OutsideRoots(f"{path!r} is not a path of the cluster's file system. "
                           + accepted)
    if named in _HOSTLESS_SCHEMES and urllib.parse.urlparse(path).netloc:
        raise OutsideRoots(f"{path!r} names the host "
                           f"{urllib.parse.urlparse(path).netloc!r}. " + accepted)


def local_roots(roots):
    """The real (links resolved) paths of the roots that are local paths."""
    return tuple(os.path.realpath(root) for root in map(local_path, roots) if root is not None)


def _is_under(real_path, real_roots):
    return any(real_path == root or real_path.startswith(root.rstrip("/") + "/")
               for root in real_roots)


def check_resolves_under(path, roots):
    """Refuses a local ``path`` that is, or holds, a link to a place outside ``roots``.

    Args:
        path: The data path as the client gave it (already under a root by prefix).
        roots: The allowed roots, as the administrator gave them.

    Raises:
        OutsideRoots: The path, or an entry of the folder it names (files and folders
            at any depth, links followed), resolves outside every local root; or the
            folder holds more than `MAX_ENTRIES_CHECKED` entries.
    """
    local = local_path(path)
    real_roots = local_roots(roots)
    if local is None or not real_roots:
        return
    real = os.path.realpath(local)
    if not _is_under(real, real_roots):
        raise OutsideRoots(f"{path!r} resolves outside the allowed data roots (a symbolic "
                           "link leads out of them).")
    _check_entries_under(path, real, real_roots)


def _check_entries_under(path, real_folder, real_roots):
    """Resolves every entry below ``real_folder`` (a loop over folders, each seen once, so
    a link cycle ends)."""
    if not os.path.isdir(real_folder):
        return
    pending, seen, checked = [real_folder], {real_folder}, 0
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue  # unreadable here: Spark, as the same user, cannot read it either
        for entry in entries:
            checked += 1
            if checked > MAX_ENTRIES_CHECKED:
                raise OutsideRoots(
                    f"{path!r} holds more than {MAX_ENTRIES_CHECKED:,} files and folders, more "
                    "than this server checks against its allowed data roots: give a folder "
                    "with fewer entries.")
            real = os.path.realpath(entry.path) if entry.is_symlink() else entry.path
            if not _is_under(real, real_roots):
                raise OutsideRoots(
                    f"{entry.path!r} in {path!r} is a link to a place outside the allowed "
                    "data roots.")
            if os.path.isdir(real) and real not in seen:
                seen.add(real)
                pending.append(real)


# A local path or file: URL in an error message: up to a space, a quote or a bracket.
# Not after a word character or a dot: 26/11/30 (a date) or a relative a/b names no path.
_PATH_IN_TEXT = re.compile(r"(?<![\w./])(?:file:)?/[^\s'\"`,;()\[\]<>]*")
# Java's errors (Spark, Parquet, Hadoop) say what they found in a file: its length, its
# last bytes ("Expected magic number at tail, but found [83, 69, 67, 82]").
_JAVA_ERROR = re.compile(r"Py4JJavaError|\bjava\.|\borg\.apache\.|\bscala\.")
# The same details, quoted inside another error's message (the CLI's CommandError).
_FILE_DETAILS = re.compile(r"found \[[-\d, ]*\]|length is too low: \d+|"
                           r"Expected magic number at tail")


def redact(message, roots, own_paths=()):
    """An error message fit for a client: no path outside ``roots`` (other than
    ``own_paths``, the ones the client named), no text of a Java error.

    Args:
        message: The error (a job's, as its process wrote it), or None.
        roots: The allowed data roots (none: every local path is redacted).
        own_paths: Paths the client gave (its data path), shown as they are.

    Returns:
        The message, or None for None.
    """
    if message is None:
        return None
    if _JAVA_ERROR.search(message):
        # The innermost Java error quotes files' bytes and lengths: only its kind.
        kind = message.split(":", 1)[0] if ":" in message[:80] else "The job's Spark error"
        return (f"{kind}: Spark failed reading or processing the data (the details, which "
                "may quote the data, are in the server's job log; ask its administrator).")
    message = _FILE_DETAILS.sub("<details in the server's job log>", message)
    real_roots = local_roots(roots)
    own = set(own_paths)

    def replace(match):
        text = match.group(0)
        local = local_path(text) or text
        if text in own or text.rstrip(".") in own or \
                (real_roots and _is_under(os.path.realpath(local.rstrip(".")), real_roots)):
            return text
        return "<a path outside the data roots>"

    return _PATH_IN_TEXT.sub(replace, message)[:2000]
