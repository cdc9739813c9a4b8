"""tilegen.staging: a Ctrl-C landing at the worst moment of creating or removing a build
folder or a staging file leaves nothing behind (the windows tempfile leaves open)."""

from __future__ import annotations

import os
import shutil

import pytest

from tilegen import staging


@pytest.fixture
def temp(tmp_path, monkeypatch):
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(staging.tempfile, "tempdir", str(folder))
    return folder


def test_a_build_folder_is_removed_when_its_block_ends(temp):
    with staging.temporary_directory("build-") as folder:
        assert os.path.isdir(folder) and os.path.dirname(folder) == str(temp)
        (temp / os.path.basename(folder) / "file").write_text("x")
    assert list(temp.iterdir()) == []


def test_ctrl_c_just_after_the_folder_is_created(temp, monkeypatch):
    real_mkdir = os.mkdir

    def created_then_interrupted(path, *args, **kwargs):
        real_mkdir(path, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(staging.os, "mkdir", created_then_interrupted)
    with pytest.raises(KeyboardInterrupt), staging.temporary_directory("build-"):
        pytest.fail("the block must not run")
    assert list(temp.iterdir()) == []


def test_ctrl_c_inside_the_removal_finishes_it(temp, monkeypatch):
    real_rmtree = shutil.rmtree
    calls = []

    def interrupted_once(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 1:
            raise KeyboardInterrupt
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(staging.shutil, "rmtree", interrupted_once)
    with pytest.raises(KeyboardInterrupt), staging.temporary_directory("build-") as folder:
        (temp / os.path.basename(folder) / "file").write_text("x")
    assert len(calls) == 2
    assert list(temp.iterdir()) == []


def test_a_staging_name_is_fresh_and_its_file_exclusive(tmp_path):
    names = {staging.staging_name(tmp_path, ".s-") for _ in range(100)}
    assert len(names) == 100
    name = names.pop()
    os.close(staging.create_staging_file(name))
    assert oct(os.stat(name).st_mode & 0o777) == oct(0o600)
    with pytest.raises(FileExistsError):
        staging.create_staging_file(name)
