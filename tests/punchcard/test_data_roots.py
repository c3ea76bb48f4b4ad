"""Punchcard's allowed data roots, case by case: which data paths a submission may name.

Two checks stand between a client and the files Spark reads: the path as written must be
under a root (separators, schemes, hosts, ``..``), and a local path must resolve under a
local root, links followed (`distkeras.data_roots`). Each case goes through
`validate_submission`, the server's own check of a submission, and the link cases also
through `data_roots.check_resolves_under`. No Spark.
"""

import os

import pytest

from distkeras.punchcard import data_roots
from distkeras.punchcard.submissions import BadRequest, validate_submission


def submission(path):
    """A submission that is valid up to its data path (it has no trainer yet)."""
    return {"job_name": "roots", "data_path": path, "num_executors": 1, "num_processes": 1}


def accepted(path, roots):
    """Whether `validate_submission` lets ``path`` past its data path check: the check
    after it (the missing trainer) is then what refuses the submission."""
    with pytest.raises(BadRequest) as refused:
        validate_submission(submission(path), list(roots))
    message = str(refused.value)
    if "'data_path'" in message:
        return False
    assert "'trainer'" in message, message
    return True


LOCAL = ["/srv/data"]
HDFS = ["hdfs://nn/data"]


@pytest.mark.parametrize("roots, path, allowed", [
    # Local roots: a path under the root, component by component.
    (LOCAL, "/srv/data", True),
    (LOCAL, "/srv/data/", True),
    (LOCAL, "/srv/data/x.parquet", True),
    (LOCAL, "/srv/data/a/b/part-0.parquet", True),
    (["/srv/data/"], "/srv/data/x.parquet", True),  # a root given with its slash
    (LOCAL, "/srv/data-secret", False),  # a sibling that shares the root's prefix
    (LOCAL, "/srv/data-secret/x.parquet", False),
    (LOCAL, "/srv/datax/x.parquet", False),
    (LOCAL, "/srv/dat", False),
    (LOCAL, "/srv", False),
    (LOCAL, "/srv/other/x.parquet", False),
    (LOCAL, "/etc/passwd", False),
    (LOCAL, "srv/data/x.parquet", False),  # relative: read from the job's folder
    # '..' climbs out whatever the prefix says; '\' is a separator too.
    (LOCAL, "/srv/data/../secret", False),
    (LOCAL, "/srv/data/a/../../secret/x", False),
    (LOCAL, "/srv/data/..", False),
    (LOCAL, "/srv/data\\..\\secret", False),
    # Other schemes, or a file: URL, are not the root's file system as written.
    (LOCAL, "file:///srv/data-secret/x", False),
    (LOCAL, "hdfs://nn/srv/data/x", False),
    # Spark's globs and lists would expand into other paths.
    (LOCAL, "/srv/data/*", False),
    (LOCAL, "/srv/data/x,/etc/passwd", False),
    (LOCAL, "/srv/data/{x,../../etc}", False),
    (LOCAL, "/srv/data/x?", False),
    # Remote roots: scheme, host and path, each exactly.
    (HDFS, "hdfs://nn/data", True),
    (HDFS, "hdfs://nn/data/x.parquet", True),
    (HDFS, "hdfs://nn/data/a/b", True),
    (HDFS, "hdfs://nn/other/x.parquet", False),
    (HDFS, "hdfs://nn/data-secret/x.parquet", False),
    (HDFS, "hdfs://nn/datax", False),
    (HDFS, "hdfs://nn/", False),
    (HDFS, "hdfs://nn", False),
    (HDFS, "hdfs://other/data/x.parquet", False),  # another name node
    (HDFS, "hdfs://nn.evil.example/data/x", False),
    (HDFS, "hdfs://nn:9000/data/x.parquet", False),  # another port: another service
    (HDFS, "HDFS://nn/data/x.parquet", False),
    (HDFS, "s3a://nn/data/x.parquet", False),
    (HDFS, "file:///data/x.parquet", False),
    (HDFS, "/data/x.parquet", False),
    (HDFS, "hdfs://nn/data/../other", False),
    (HDFS, "hdfs:///data/x.parquet", False),  # the default name node may be another
    # Several roots: under any one of them.
    (LOCAL + HDFS, "hdfs://nn/data/x", True),
    (LOCAL + HDFS, "/srv/data/x", True),
    (LOCAL + HDFS, "hdfs://nn/srv/data/x", False),
    # No roots: any path the other checks pass.
    ([], "hdfs://anything/at/all", True),
    ([], "/srv/data-secret/x", True),
    ([], "/srv/data/../etc", False),  # '..' is refused everywhere
])
def test_a_data_path_is_under_a_root_component_by_component(roots, path, allowed):
    assert accepted(path, roots) is allowed


@pytest.mark.parametrize("path, local", [
    ("/a/b", "/a/b"),
    ("a/b", "a/b"),
    ("file:///a/b", "/a/b"),
    ("file:/a/b", "/a/b"),
    ("file:///a%20b/c", "/a b/c"),
    ("FILE:///a/b", "/a/b"),  # Hadoop reads a scheme in any case
    ("File:/a/b", "/a/b"),
    ("local:/a/b", None),  # not local as written: refused without roots (any scheme is)
    ("file:///a/%2e%2e/b", "/a/../b"),  # decoded: then resolved, and checked
    ("hdfs://nn/a", None),
    ("s3a://bucket/key", None),
    ("viewfs://cluster/a", None),
])
def test_local_path_names_the_local_file_system_only(path, local):
    assert data_roots.local_path(path) == local


@pytest.fixture
def tree(tmp_path):
    """``data`` (the root), its sibling ``data-secret`` and an outside folder, real ones."""
    for folder in ("data/sub", "data-secret", "outside"):
        (tmp_path / folder).mkdir(parents=True)
    for name in ("data/x.parquet", "data/sub/part-0.parquet", "data-secret/key",
                 "outside/passwd"):
        (tmp_path / name).write_text("rows")
    return tmp_path


def _link(tree, name, target):
    """A symbolic link ``data/<name>`` to ``target`` (relative to ``tree``, or absolute
    where it starts with '/')."""
    link = tree / "data" / name
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target if target.startswith("/") else str(tree / target), link)
    return str(link)


@pytest.mark.parametrize("name, target, allowed", [
    ("out", "outside", False),                      # a link to a folder outside
    ("out.parquet", "outside/passwd", False),      # to a file outside
    ("secret", "data-secret", False),               # to the sibling sharing the prefix
    ("secret.parquet", "data-secret/key", False),
    ("etc", "/etc", False),
    ("up", "data/..", False),                       # to the root's parent
    ("inside", "data/sub", True),                   # to a folder under the root
    ("inside.parquet", "data/x.parquet", True),
    ("loop", "data", True),                         # a cycle ends
])
def test_a_link_under_the_root_is_followed(tree, name, target, allowed):
    path = _link(tree, name, target)
    roots = [str(tree / "data")]
    assert accepted(path, roots) is allowed
    assert accepted("file://" + path, ["file://" + str(tree / "data")]) is allowed
    if allowed:
        data_roots.check_resolves_under(path, roots)
    else:
        with pytest.raises(data_roots.OutsideRoots, match="outside the allowed"):
            data_roots.check_resolves_under(path, roots)


@pytest.mark.parametrize("target", ["outside/passwd", "data-secret", "data-secret/key"])
def test_a_link_anywhere_in_the_folder_spark_lists_is_followed(tree, target):
    """Spark reads every file of a Parquet folder: a link among its part files counts."""
    _link(tree, "sub/deeper/part-9.parquet", target)
    with pytest.raises(data_roots.OutsideRoots, match="part-9.parquet"):
        data_roots.check_resolves_under(str(tree / "data"), [str(tree / "data")])
    assert not accepted(str(tree / "data" / "sub"), [str(tree / "data")])


def test_a_root_that_is_a_link_is_resolved_too(tree):
    os.symlink(str(tree / "data"), str(tree / "alias"))
    roots = [str(tree / "alias")]
    assert accepted(str(tree / "alias" / "x.parquet"), roots)
    assert accepted(str(tree / "alias" / "sub"), roots)
    _link(tree, "out", "outside")
    assert not accepted(str(tree / "alias" / "out"), roots)


def test_an_encoded_dot_dot_in_a_file_url_is_resolved_before_it_is_checked(tree):
    root = "file://" + str(tree / "data")
    assert not accepted(root + "/%2e%2e/data-secret/key", [root])
    assert accepted(root + "/sub/part-0.parquet", [root])


def test_a_folder_of_too_many_entries_is_refused_naming_the_limit(tree, monkeypatch):
    monkeypatch.setattr(data_roots, "MAX_ENTRIES_CHECKED", 2)
    with pytest.raises(data_roots.OutsideRoots, match="more than 2 files and folders"):
        data_roots.check_resolves_under(str(tree / "data"), [str(tree / "data")])
