"""The paradigms are listed once (``settings.PARADIGMS``): the paradigms' registry, the
``algorithm`` setting's choices and the modules of ``components/paradigms/`` all agree with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sublimate.components import paradigms
from sublimate.components.base import settings

# Modules of components/paradigms/ that are not a paradigm of their own.
NOT_PARADIGMS = {"__init__", "base", "lr_schedule", "gradient_buckets", "outer_codecs"}


def test_the_registry_and_the_algorithm_choices_come_from_the_one_list() -> None:
    assert tuple(paradigms.PARADIGMS) == settings.PARADIGM_NAMES == tuple(settings.PARADIGMS)
    assert settings.BY_NAME["algorithm"].choices == settings.PARADIGM_NAMES
    assert set(settings.COLLECTIVE_PARADIGMS) < set(settings.PARADIGM_NAMES)
    for name, target in settings.PARADIGMS.items():
        assert paradigms.PARADIGMS[name] == f"sublimate.components.paradigms.{target}"


def test_every_paradigm_module_is_listed_and_every_entry_is_a_paradigm() -> None:
    modules = {path.stem for path in Path(paradigms.__file__).parent.glob("*.py")}
    listed = {target.partition(":")[0] for target in settings.PARADIGMS.values()}
    assert listed == modules - NOT_PARADIGMS
    for name in settings.PARADIGM_NAMES:
        assert issubclass(paradigms.paradigm_class(name), paradigms.Paradigm), name


def test_the_list_is_read_without_torch() -> None:
    program = ("import sys\n"
               "from sublimate.components.base import settings\n"
               "assert settings.PARADIGM_NAMES\n"
               "print('torch' in sys.modules)\n")
    completed = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                               check=True)
    assert completed.stdout.strip() == "False"
