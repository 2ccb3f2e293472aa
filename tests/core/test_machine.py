"""core/machine.py: the CPU model, vector extensions and cores, read from a cpuinfo file."""

import os

from jaxrl_frontier.core import machine

CPUINFO = """processor\t: 0
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx avx2 fma
processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx avx2 fma
"""


def test_cpu_info_reads_the_model_and_the_vector_extensions(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    info = machine.cpu_info(str(path))
    assert info == dict(
        cpu_model="AMD EPYC 7B13", vector_extensions=["AVX2"], cpu_count=os.cpu_count()
    )
    path.write_text(CPUINFO.replace("avx2 fma", "avx2 avx512f amx_tile"))
    assert machine.cpu_info(str(path))["vector_extensions"] == ["AVX2", "AVX-512", "AMX"]
    assert machine.machine_name([0], str(path)) == "AMD EPYC 7B13, 1 core"
    assert machine.machine_name([0, 3], str(path)) == "AMD EPYC 7B13, 2 cores"
    assert machine.cpu_info(str(tmp_path / "none"))["vector_extensions"] == []
