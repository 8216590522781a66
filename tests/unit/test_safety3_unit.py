"""Issue 45, items 4 and 5, in milliseconds (the cycle against the in-memory host of
tests/support_cycle.py): installed = plan is checked after every install, `--lock`'s included
(against what the lock held at the plan), and `keep-old-version`'s kept set found in the window
must be the one the plan was made with."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rewheel import commands
from rewheel.errors import EXIT_REVERTED

from support_cycle import PKG, World, version


def _lock(path: Path, pins: dict[str, str]) -> Path:
    path.write_text('lock-version = "1.0"\n' + "".join(
        f'[[packages]]\nname = "{n}"\nversion = "{v}"\n'
        f'wheels = [{{ url = "https://example.invalid/{n}-{v}-py3-none-any.whl" }}]\n' for n, v in pins.items()))
    return path


def test_the_install_is_checked_against_what_the_lock_held_at_the_plan(world: tuple[World, commands.Target],
                                                                        tmp_path: Path) -> None:
    w, t = world
    t = replace(t, recipe=replace(t.recipe, install=replace(t.recipe.install, staged=False)))
    lock = _lock(tmp_path / "pylock.toml", {PKG: "3.0.0"})
    rep = commands.run(t, lock=str(lock))  # the fake uv installs 2.0.0
    assert (rep.status, rep.exit_code) == ("reverted", EXIT_REVERTED)
    assert rep.failure is not None and "does not match its plan" in rep.failure.message
    assert f"{PKG}: planned 3.0.0, installed 2.0.0" in rep.failure.message
    assert version(t) == "1.0.0"
    assert rep.plan is not None and rep.plan.install.lock != str(lock)  # the plan's copy, not the file


def test_a_lock_is_installed_from_its_copy(world: tuple[World, commands.Target], tmp_path: Path) -> None:
    w, t = world
    t = replace(t, recipe=replace(t.recipe, install=replace(t.recipe.install, staged=False)))
    lock = _lock(tmp_path / "pylock.toml", {PKG: "2.0.0"})
    seen: list[Path | None] = []
    install = w.install

    def recording(recipe, **kw):  # noqa: ANN001, ANN202
        seen.append(kw.get("lock"))
        lock.write_text("replaced after the plan")  # too late: the copy is what is installed
        return install(recipe, **kw)

    t.host.install = recording  # type: ignore[method-assign,assignment]
    rep = commands.run(t, lock=str(lock))
    assert rep.status == "upgraded", rep.failure
    assert seen and seen[0] is not None and seen[0] != lock and seen[0].parent == Path(rep.run_dir or "")
