"""CPU time of compiling one MiniLM (B, T) shape, by stage (ad hoc; not a benchmark).

    PYTHONPATH=. python scripts/minilm_compile_time.py --weights bf16x3 --shape 8 48

Each round compiles the shape's program from source as SentenceEncoder.compile does, in
stages timed with time.process_time(): the frontend (parse, check, specialise, and for
bf16x3 the precision transform), planning (lowering and the schedule passes), building the
LLVM IR, printing it, parsing it, LLVM's O3 pipeline and machine code; then prints each
stage's minimum over the rounds and the module's size. `--whole` times the encoder's own
`compile` (in-memory cache cleared each round) instead, machine code for the entry
included. Run it on a quiet machine and compare trees interleaved: the figures move with
load.
"""

from __future__ import annotations

import argparse
import time

import llvmlite.binding as llvm


def _stages(encoder, batch: int, length: int, weight_type: str) -> dict[str, float]:
    from kina_frontend import check_source, load_source, specialize
    from kina_models.minilm.encoder import ENTRY, PROGRAM
    from tilegen import config
    from tilegen.pipeline import PlanTable, codegen, optimize, target_machine

    options = config.load()
    clock = time.process_time
    marks = [("start", clock())]
    consts = encoder.consts(batch, length)
    if weight_type == "f32":
        program = specialize(check_source(load_source(PROGRAM), consts))
    else:
        program = encoder._narrow_program(consts, weight_type)[0]
    marks.append(("frontend", clock()))
    plan = PlanTable(program, (ENTRY,), options)[ENTRY]
    marks.append(("plan", clock()))
    module = codegen([plan])
    marks.append(("build IR", clock()))
    text = str(module)
    marks.append(("print", clock()))
    parsed = llvm.parse_assembly(text)
    parsed.verify()
    machine = target_machine(options.target)
    parsed.triple = options.target.triple
    parsed.data_layout = str(machine.target_data)
    marks.append(("parse", clock()))
    optimize(parsed, machine)
    marks.append(("O3", clock()))
    machine.emit_object(parsed)
    marks.append(("machine code", clock()))
    times = {name: now - before
             for (_, before), (name, now) in zip(marks, marks[1:], strict=False)}
    times["total"] = marks[-1][1] - marks[0][1]
    defined = [f for f in module.functions if f.blocks]
    times["functions"] = len(defined)
    times["instructions"] = sum(len(block.instructions) for f in defined for block in f.blocks)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="bf16x3", choices=("auto", "f32", "bf16",
                                                                "bf16x3"))
    parser.add_argument("--shape", type=int, nargs=2, default=(8, 48), metavar=("B", "T"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--whole", action="store_true",
                        help="time SentenceEncoder.compile and the entry's machine code")
    args = parser.parse_args()

    import tilegen
    from kina_models.minilm import SentenceEncoder
    from tilegen.cache import MEMORY

    encoder = SentenceEncoder(weights=args.weights)
    batch, length = args.shape
    weight_type = encoder.program_weights(batch, length)
    print(f"({batch}, {length}) on the {weight_type} program ({encoder.weight_choice()})")
    if args.whole:
        seconds = []
        for _ in range(args.rounds):
            MEMORY.clear()
            started = time.process_time()
            tilegen.program_of(encoder.compile(batch, length)).functions  # noqa: B018
            seconds.append(time.process_time() - started)
        print("CPU seconds per compile:", " ".join(f"{s:.3f}" for s in seconds))
        return
    rounds = [_stages(encoder, batch, length, weight_type) for _ in range(args.rounds)]
    for name in rounds[0]:
        best = min(r[name] for r in rounds)
        print(f"{name:>14}: {best:.3f}" if isinstance(best, float) else f"{name:>14}: {best}")


if __name__ == "__main__":
    main()
