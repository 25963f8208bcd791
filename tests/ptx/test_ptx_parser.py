"""Parser and analysis on hand-written PTX: constructs, dataflow rules, and clean one-line errors."""

from __future__ import annotations

import dataclasses

import pytest

from tessera.ptx.analysis import Access, EntryAccess, ParamAccess, analyze_ptx
from tessera.ptx.body import parse_body
from tessera.ptx.parser import Function, Param, PtxSyntaxError, make, parse_ptx, split_operands

HEAD = ".version 8.0\n.target sm_90\n.address_size 64\n"


def kernel(body: str, params: str = ".param .u64 k_param_0,\n\t.param .u64 k_param_1") -> str:
    return HEAD + f".visible .entry k(\n\t{params}\n)\n{{\n\t.reg .b64 %rd<20>;\n{body}\n}}\n"


def classes(body: str, params: str = ".param .u64 k_param_0,\n\t.param .u64 k_param_1") -> list[str]:
    e = analyze_ptx(kernel(body, params))["k"]
    return [str(p.access) for p in e.params] + (["indirect"] if e.indirect else [])


LOAD_P0 = "ld.param.u64 %rd1, [k_param_0];\nld.param.u64 %rd2, [k_param_1];\ncvta.to.global.u64 %rd3, %rd1;\n"


def test_params_ptr_attributes_and_byte_arrays() -> None:
    m = parse_ptx(HEAD + ".visible .entry e(\n.param .u64 .ptr .global .align 16 e_param_0,\n"
                  ".param .align 8 .b8 e_param_1[24],\n.param .f32 e_param_2\n)\n.maxntid 128, 1, 1\n{\nret;\n}\n")
    p = m.functions["e"].params
    assert (p[0].ptr_space, p[0].align, p[0].size_bytes) == ("global", 16, 8)
    assert (p[1].count, p[1].size_bytes, p[1].may_hold_pointer) == (24, 24, True)
    assert (p[2].size_bytes, p[2].may_hold_pointer) == (4, False)


def test_predicated_vector_store_through_loop_carried_pointer() -> None:
    body = LOAD_P0 + "$L1:\n@%p1 st.global.v4.f32 [%rd4+16], {%f1, %f2, %f3, %f4};\n" \
        "add.s64 %rd4, %rd3, 16; // loop-carried: %rd4 is defined after its use\n@!%p2 bra $L1;"
    assert classes(body) == ["written", "untouched"]


def test_scaled_offset_is_not_a_base() -> None:
    body = LOAD_P0 + "mul.wide.s32 %rd5, %r1, 4;\nshl.b64 %rd6, %rd2, 2;\nadd.s64 %rd7, %rd3, %rd6;\n" \
        "ld.global.f32 %f1, [%rd7];"
    assert classes(body) == ["read", "untouched"]


def test_unscaled_sum_of_two_params_attributes_both() -> None:
    body = LOAD_P0 + "add.s64 %rd7, %rd3, %rd2;\nst.global.u8 [%rd7], %rs1;"
    assert classes(body) == ["written", "written"]


def test_pointer_loaded_from_memory_is_wild() -> None:
    body = LOAD_P0 + "ld.global.u64 %rd8, [%rd3];\nst.global.f32 [%rd8], %f1;"
    assert classes(body) == ["read-write", "read-write", "indirect"]


def test_narrow_index_from_memory_keeps_base() -> None:
    body = LOAD_P0 + "ld.global.u32 %r1, [%rd3];\nmul.wide.u32 %rd9, %r1, 4;\ncvta.to.global.u64 %rd10, %rd2;\n" \
        "add.s64 %rd11, %rd10, %rd9;\natom.global.add.f32 %f1, [%rd11], %f2;"
    e = analyze_ptx(kernel(body))["k"]
    assert [str(p.access) for p in e.params] == ["read", "atomic"] and not e.indirect
    assert e.params[1].data_dependent and not e.params[0].data_dependent


def test_pointer_assembled_from_loaded_halves_is_wild() -> None:
    body = LOAD_P0 + "ld.global.v2.u32 {%r1, %r2}, [%rd3];\nmov.b64 %rd12, {%r1, %r2};\nred.global.add.u32 [%rd12], 1;"
    assert classes(body)[-1] == "indirect"


def test_unmodelled_op_widens_only_its_inputs() -> None:
    body = LOAD_P0 + "frobnicate.b64 %rd13, %rd3;\nld.global.f32 %f1, [%rd13];"
    assert classes(body) == ["read-write", "untouched", "indirect"]


def test_spill_through_local_memory_keeps_provenance() -> None:
    body = ".local .align 8 .b8 __local_depot0[8];\nmov.u64 %SPL, __local_depot0;\n" + LOAD_P0 + \
        "st.local.u64 [%SPL], %rd3;\nld.local.u64 %rd14, [%SPL];\nst.global.f32 [%rd14], %f1;"
    assert classes(body) == ["written", "untouched"]


def test_call_into_func_and_return_value() -> None:
    text = HEAD + ".func (.param .b64 func_retval0) id(.param .b64 id_param_0)\n{\n" \
        "ld.param.u64 %rd1, [id_param_0];\nst.param.b64 [func_retval0+0], %rd1;\nret;\n}\n" \
        ".visible .entry k(.param .u64 k_param_0, .param .u64 k_param_1)\n{\n" \
        "ld.param.u64 %rd1, [k_param_1];\n{ // callseq 0, 0\n.param .b64 param0;\nst.param.b64 [param0+0], %rd1;\n" \
        ".param .b64 retval0;\ncall.uni (retval0),\nid,\n(\nparam0\n);\nld.param.b64 %rd2, [retval0+0];\n}\n" \
        "st.global.f32 [%rd2], %f1;\nret;\n}\n"
    e = analyze_ptx(text)["k"]
    assert [str(p.access) for p in e.params] == ["untouched", "written"] and not e.indirect


@pytest.mark.parametrize(("args", "rets"), [("param0, param1", "(retval0)"), ("", "(retval0)"), ("param0", "")])
def test_call_with_the_wrong_arity_is_a_clean_error(args: str, rets: str) -> None:
    # found by fuzzing: a recursive call with one argument fewer ended in zip()'s own ValueError
    text = HEAD + ".func (.param .b64 func_retval0) id(.param .b64 id_param_0)\n{\n" \
        "ld.param.u64 %rd1, [id_param_0];\nst.param.b64 [func_retval0+0], %rd1;\nret;\n}\n" \
        ".visible .entry k(.param .u64 k_param_0)\n{\n{ // callseq 0, 0\n.param .b64 param0;\n" \
        ".param .b64 param1;\n.param .b64 retval0;\n" + f"call.uni {rets}{',' if rets else ''} id, ({args});\n}}\nret;\n}}\n"
    with pytest.raises(ValueError, match=r"^f\.ptx:\d+: call to id passes \d argument\(s\) and \d result\(s\); "
                       r"id takes 1 and returns 1$"):
        analyze_ptx(text, "f.ptx")


def test_call_to_function_without_body_is_wild() -> None:
    text = HEAD + ".extern .func mystery(.param .b64 mystery_param_0);\n" \
        ".visible .entry k(.param .u64 k_param_0)\n{\n{\n.param .b64 param0;\ncall.uni mystery, (param0);\n}\nret;\n}\n"
    e = analyze_ptx(text)["k"]
    assert str(e.params[0].access) == "read-write" and e.indirect


def test_tensor_map_by_value_and_bulk_store() -> None:
    body = "mov.b64 %rd1, k_param_0;\ncvta.param.u64 %rd2, %rd1;\n" \
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd2, {%r1, %r2}], [%r3];\n" \
        "ld.param.u64 %rd4, [k_param_1];\ncp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes " \
        "[%r4], [%rd4], 4096, [%r5];\nprefetch.global.L2 [%rd4];\ncp.async.bulk.commit_group;"
    assert classes(body, ".param .align 64 .b8 k_param_0[128],\n.param .u64 k_param_1") == ["written", "read"]


def test_store_after_a_directive_on_its_line_is_not_swallowed() -> None:
    # once the whole line was skipped as a .loc line: a missed write
    assert classes(LOAD_P0 + ".loc 1 2 3; st.global.f32 [%rd3], %f1;") == ["written", "untouched"]


def test_comments_and_sections_are_skipped() -> None:
    text = "/* block\ncomment */\n" + kernel(LOAD_P0 + "st.global.f32 [%rd3], %f1; // trailing") + \
        '.file 1 "/tmp//x.py"\n.section .debug_abbrev\n{\n.b8 1\n.b8 17\n}\n'
    assert [str(p.access) for p in analyze_ptx(text)["k"].params] == ["written", "untouched"]


def test_split_operands() -> None:
    assert split_operands("%r1, [%rd1+8], {%f1, %f2}") == ["%r1", "[%rd1+8]", "{%f1, %f2}"]
    assert split_operands("[%rd1, {%r1}") is None


@pytest.mark.parametrize(("text", "line", "needle"), [
    (kernel("ld.global.f32 %f1, [%rd1]"), 10, "missing ';'"),
    (kernel("ld.global.f32 %f1, [%rd1;"), 10, "malformed operands"),
    (kernel("st.global.f32 %rd1, %f1;"), 10, "address operand"),
    (kernel("@ bra L;"), 10, "predicate guard"),
    (kernel("st.global.v2.f32 [%rd1], {%f1;, %f2};"), 10, "inside braces"),  # once infinite recursion
    (kernel("}"), 11, "top-level"),  # the stray brace closes the body early
    (HEAD + ".visible .entry k(.param .u64 k_param_0)\n{\nret;\n", 4, "never closes"),
    (HEAD + ".visible .entry k(.param .u64 k_param_0\n{\nret;\n}\n", 4, "header"),
    (".target sm_90\n", 1, "missing .version"),
    ("/* open", 1, "unterminated"),
])
def test_errors_are_one_line_with_location(text: str, line: int, needle: str) -> None:
    with pytest.raises(PtxSyntaxError) as ei:
        analyze_ptx(text, "t.ptx")
    msg = str(ei.value)
    assert isinstance(ei.value, ValueError) and "\n" not in msg
    assert msg.startswith(f"t.ptx:{line}:") and needle in msg


@pytest.mark.parametrize(("cls", "fields"), [
    (Param, {"name": "p", "type": ".u64", "count": None, "align": None, "ptr_space": None}),
    (Function, {"name": "f", "is_entry": True, "params": (), "returns": (), "body": None, "locals": {}, "line": 3,
                "span": (9, 20, 4)}),
    (ParamAccess, {"name": "p", "type": ".u64", "access": Access.READ, "reads": 1, "writes": 0, "atomics": 0,
                   "conservative": 0, "data_dependent": False}),
    (EntryAccess, {"name": "k", "params": (), "indirect": False, "reasons": (), "globals": {}}),
])
def test_make_equals_construction(cls: type, fields: dict[str, object]) -> None:
    assert set(fields) == {f.name for f in dataclasses.fields(cls)}  # make needs every field
    made, built = make(cls, dict(fields)), cls(**fields)
    assert made == built and repr(made) == repr(built)
    if cls is not EntryAccess:  # its globals dict makes it unhashable either way
        assert hash(made) == hash(built)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.name = "x"  # type: ignore[misc]


def test_bodies_read_later_give_the_same_statements() -> None:
    # parse_ptx(read_bodies=False) keeps each body's span; the lowering stage reads it then
    text = (".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k(.param .u64 a)\n{\n"
            "\t.reg .b64 %rd<3>;\n\tld.param.u64 \t%rd1, [a];\n\tst.global.u32 \t[%rd1], 0;\n\tret;\n}\n")
    eager, lazy = parse_ptx(text, "k.ptx"), parse_ptx(text, "k.ptx", read_bodies=False)
    fe, fl = eager.functions["k"], lazy.functions["k"]
    assert fl.body is None and fe.span == fl.span and fl.defined
    body, _ = parse_body("k.ptx", lazy.text, *fl.span)  # type: ignore[misc]
    assert body == fe.body and [i.line for i in body] == [7, 8, 9]
