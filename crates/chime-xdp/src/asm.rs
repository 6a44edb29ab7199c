//! A small assembler for the XDP programs (`bpf`, `responder`): BPF instructions as the kernel reads
//! them, named registers and opcodes, and forward jumps to labels.
//!
//! The programs are short enough to write instruction by instruction, which keeps a BPF toolchain
//! (clang, bpf-linker) out of the build and an object file out of the repository; the kernel's
//! verifier checks every instruction at load, and the tests load both programs.

/// One BPF instruction, as the kernel reads it (`struct bpf_insn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Insn {
    pub(crate) code: u8,
    /// Destination register in the low nibble, source register in the high one.
    pub(crate) regs: u8,
    pub(crate) off: i16,
    pub(crate) imm: i32,
}

/// A register, `R0`..`R10`. r0 holds a call's result and the program's; r1–r5 a call's arguments,
/// clobbered by it; r6–r9 survive calls; r10 is the read-only frame pointer.
pub(crate) type Reg = u8;
pub(crate) const R0: Reg = 0;
pub(crate) const R1: Reg = 1;
pub(crate) const R2: Reg = 2;
pub(crate) const R3: Reg = 3;
pub(crate) const R4: Reg = 4;
pub(crate) const R5: Reg = 5;
pub(crate) const R6: Reg = 6;
pub(crate) const R7: Reg = 7;
pub(crate) const R8: Reg = 8;
pub(crate) const R9: Reg = 9;
pub(crate) const FP: Reg = 10;

// Instruction classes (include/uapi/linux/bpf.h, bpf_common.h).
const CLASS_LDX: u8 = 0x01;
const CLASS_ST: u8 = 0x02;
const CLASS_STX: u8 = 0x03;
const CLASS_ALU: u8 = 0x04;
const CLASS_JMP: u8 = 0x05;
const CLASS_JMP32: u8 = 0x06;
const CLASS_ALU64: u8 = 0x07;
/// The source is the register in `regs`' high nibble (else the immediate).
const SRC_X: u8 = 0x08;
const MODE_MEM: u8 = 0x60;

/// The width of a load or store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Size {
    B = 0x10,
    H = 0x08,
    W = 0x00,
    DW = 0x18,
}

/// An ALU operation (64-bit: `ALU64`).
pub(crate) type AluOp = u8;
pub(crate) const ADD: AluOp = 0x00;
pub(crate) const SUB: AluOp = 0x10;
pub(crate) const MUL: AluOp = 0x20;
pub(crate) const DIV: AluOp = 0x30;
pub(crate) const OR: AluOp = 0x40;
pub(crate) const AND: AluOp = 0x50;
pub(crate) const LSH: AluOp = 0x60;
pub(crate) const RSH: AluOp = 0x70;
const NEG: AluOp = 0x80;
pub(crate) const MOD: AluOp = 0x90;
pub(crate) const XOR: AluOp = 0xa0;
const MOV: AluOp = 0xb0;
const END: AluOp = 0xd0;

/// A jump condition; the unsigned ones compare as `u64` (or `u32` in a 32-bit jump), the `S` ones
/// as signed.
pub(crate) type JmpOp = u8;
const JA: JmpOp = 0x00;
pub(crate) const JEQ: JmpOp = 0x10;
pub(crate) const JGT: JmpOp = 0x20;
pub(crate) const JSET: JmpOp = 0x40;
pub(crate) const JNE: JmpOp = 0x50;
pub(crate) const JSGT: JmpOp = 0x60;
pub(crate) const JSGE: JmpOp = 0x70;
const CALL: JmpOp = 0x80;
const EXIT: JmpOp = 0x90;
pub(crate) const JLT: JmpOp = 0xa0;
pub(crate) const JSLT: JmpOp = 0xc0;

/// `src` of a 64-bit immediate load that makes it a map's file descriptor, which the kernel
/// replaces with the map at load.
const PSEUDO_MAP_FD: u8 = 1;

// Helpers by number (the `___BPF_FUNC_MAPPER` order).
pub(crate) const FN_MAP_LOOKUP_ELEM: i32 = 1;
pub(crate) const FN_KTIME_GET_NS: i32 = 5;
pub(crate) const FN_GET_PRANDOM_U32: i32 = 7;
pub(crate) const FN_REDIRECT_MAP: i32 = 51;
pub(crate) const FN_XDP_ADJUST_META: i32 = 54;
pub(crate) const FN_KTIME_GET_TAI_NS: i32 = 208;

// XDP verdicts.
pub(crate) const XDP_ABORTED: i32 = 0;
pub(crate) const XDP_DROP: i32 = 1;
pub(crate) const XDP_PASS: i32 = 2;
pub(crate) const XDP_TX: i32 = 3;

// `struct xdp_md` offsets.
pub(crate) const MD_DATA: i16 = 0;
pub(crate) const MD_DATA_END: i16 = 4;
pub(crate) const MD_DATA_META: i16 = 8;
pub(crate) const MD_RX_QUEUE_INDEX: i16 = 16;

/// A jump target, resolved when the program is finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Label(usize);

/// Builds a program instruction by instruction, with forward jumps to labels.
#[derive(Debug, Default)]
pub(crate) struct Asm {
    insns: Vec<Insn>,
    /// Where each label points, once placed.
    labels: Vec<Option<usize>>,
    /// Jumps to patch: the instruction's index and its label.
    fixups: Vec<(usize, Label)>,
}

impl Asm {
    pub(crate) fn emit(&mut self, code: u8, dst: Reg, src: Reg, off: i16, imm: i32) {
        self.insns.push(Insn {
            code,
            regs: (src << 4) | dst,
            off,
            imm,
        });
    }

    pub(crate) fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    pub(crate) fn place(&mut self, l: Label) {
        self.labels[l.0] = Some(self.insns.len());
    }

    fn jump(&mut self, code: u8, dst: Reg, src: Reg, imm: i32, to: Label) {
        self.fixups.push((self.insns.len(), to));
        self.emit(code, dst, src, 0, imm);
    }

    /// `goto to`.
    pub(crate) fn ja(&mut self, to: Label) {
        self.jump(CLASS_JMP | JA, 0, 0, 0, to);
    }

    /// `if dst <op> imm goto to`, 64-bit (the immediate sign-extended).
    pub(crate) fn jmp_k(&mut self, op: JmpOp, dst: Reg, imm: i32, to: Label) {
        self.jump(CLASS_JMP | op, dst, 0, imm, to);
    }

    /// `if dst <op> src goto to`, 64-bit.
    pub(crate) fn jmp_x(&mut self, op: JmpOp, dst: Reg, src: Reg, to: Label) {
        self.jump(CLASS_JMP | SRC_X | op, dst, src, 0, to);
    }

    /// `if (u32)dst <op> imm goto to`: the low 32 bits only.
    pub(crate) fn jmp32_k(&mut self, op: JmpOp, dst: Reg, imm: i32, to: Label) {
        self.jump(CLASS_JMP32 | op, dst, 0, imm, to);
    }

    pub(crate) fn call(&mut self, helper: i32) {
        self.emit(CLASS_JMP | CALL, 0, 0, 0, helper);
    }

    /// `r0 = bpf_map_lookup_elem(r1, fp + key)`: the map in r1 looked up by the key on the stack
    /// at `key`; r0 is the value's address, or 0. Clobbers r1–r5.
    pub(crate) fn lookup(&mut self, key: i16) {
        self.mov(R2, FP);
        self.alu_k(ADD, R2, i32::from(key));
        self.call(FN_MAP_LOOKUP_ELEM);
    }

    pub(crate) fn exit(&mut self) {
        self.emit(CLASS_JMP | EXIT, 0, 0, 0, 0);
    }

    /// `return verdict`.
    pub(crate) fn exit_with(&mut self, verdict: i32) {
        self.mov_imm(R0, verdict);
        self.exit();
    }

    pub(crate) fn mov_imm(&mut self, dst: Reg, imm: i32) {
        self.emit(CLASS_ALU64 | MOV, dst, 0, 0, imm);
    }

    pub(crate) fn mov(&mut self, dst: Reg, src: Reg) {
        self.emit(CLASS_ALU64 | SRC_X | MOV, dst, src, 0, 0);
    }

    /// `dst <op>= imm`, 64-bit: the immediate is sign-extended, so `AND` with `0xffff_ffff` is
    /// not what it looks like (use [`Self::zext32`]).
    pub(crate) fn alu_k(&mut self, op: AluOp, dst: Reg, imm: i32) {
        self.emit(CLASS_ALU64 | op, dst, 0, 0, imm);
    }

    /// `dst <op>= src`, 64-bit.
    pub(crate) fn alu_x(&mut self, op: AluOp, dst: Reg, src: Reg) {
        self.emit(CLASS_ALU64 | SRC_X | op, dst, src, 0, 0);
    }

    /// `dst = -dst`.
    pub(crate) fn neg(&mut self, dst: Reg) {
        self.emit(CLASS_ALU64 | NEG, dst, 0, 0, 0);
    }

    /// Keeps the low 32 bits of `dst`.
    pub(crate) fn zext32(&mut self, dst: Reg) {
        self.alu_k(LSH, dst, 32);
        self.alu_k(RSH, dst, 32);
    }

    /// Converts the low `bits` (16, 32 or 64) of `dst` to big-endian, zeroing the rest: a value
    /// so converted is stored in network order.
    pub(crate) fn host_to_be(&mut self, dst: Reg, bits: i32) {
        self.emit(CLASS_ALU | SRC_X | END, dst, 0, 0, bits);
    }

    pub(crate) fn ld_imm64(&mut self, dst: Reg, value: u64) {
        self.ld_imm64_src(dst, 0, value);
    }

    /// Loads the map whose file descriptor is `fd`, for a helper that takes one.
    pub(crate) fn ld_map(&mut self, dst: Reg, fd: i32) {
        self.ld_imm64_src(dst, PSEUDO_MAP_FD, fd as u32 as u64);
    }

    fn ld_imm64_src(&mut self, dst: Reg, src: Reg, value: u64) {
        self.emit(0x18, dst, src, 0, value as u32 as i32);
        self.emit(0, 0, 0, 0, (value >> 32) as u32 as i32);
    }

    /// `dst = *(size *)(src + off)`, zero-extended.
    pub(crate) fn ldx(&mut self, size: Size, dst: Reg, src: Reg, off: i16) {
        self.emit(CLASS_LDX | MODE_MEM | size as u8, dst, src, off, 0);
    }

    /// `*(size *)(dst + off) = src`.
    pub(crate) fn stx(&mut self, size: Size, dst: Reg, off: i16, src: Reg) {
        self.emit(CLASS_STX | MODE_MEM | size as u8, dst, src, off, 0);
    }

    /// `*(size *)(dst + off) = imm`.
    pub(crate) fn st(&mut self, size: Size, dst: Reg, off: i16, imm: i32) {
        self.emit(CLASS_ST | MODE_MEM | size as u8, dst, 0, off, imm);
    }

    /// `if dst + len > data_end goto to`, with `scratch` clobbered: the bounds check the verifier
    /// wants before any read of the frame.
    pub(crate) fn check_len(
        &mut self,
        scratch: Reg,
        data: Reg,
        data_end: Reg,
        len: i32,
        to: Label,
    ) {
        self.mov(scratch, data);
        self.alu_k(ADD, scratch, len);
        self.jmp_x(JGT, scratch, data_end, to);
    }

    pub(crate) fn finish(mut self) -> Vec<Insn> {
        for &(at, label) in &self.fixups {
            let target = self.labels[label.0].expect("every label used is placed");
            let off = target as isize - at as isize - 1;
            self.insns[at].off = i16::try_from(off).expect("the program is short");
        }
        self.insns
    }
}

/// Checks that every jump of `insns` lands inside it and that it ends in `exit`: for the tests of
/// each program.
#[cfg(test)]
pub(crate) fn assert_jumps_land_inside(insns: &[Insn]) {
    const CALL_CODE: u8 = CLASS_JMP | CALL;
    const EXIT_CODE: u8 = CLASS_JMP | EXIT;
    for (i, insn) in insns.iter().enumerate() {
        let class = insn.code & 0x07;
        let is_jump = (class == CLASS_JMP || class == CLASS_JMP32)
            && insn.code != CALL_CODE
            && insn.code != EXIT_CODE;
        if is_jump {
            let target = i as isize + 1 + insn.off as isize;
            assert!(
                (0..insns.len() as isize).contains(&target),
                "jump at {i} to {target}"
            );
        }
    }
    assert_eq!(insns.last().unwrap().code, EXIT_CODE);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instruction_layout_is_the_kernels() {
        assert_eq!(size_of::<Insn>(), 8);
        let mut a = Asm::default();
        a.ldx(Size::H, R4, R2, 12);
        let i = a.finish()[0];
        // dst r4 in the low nibble, src r2 in the high one.
        assert_eq!(i.regs, 0x24);
        assert_eq!(i.code, 0x69);
    }

    #[test]
    fn opcodes_are_the_kernels() {
        // A few against their values in include/uapi/linux/bpf.h, composed by hand.
        let mut a = Asm::default();
        a.stx(Size::DW, R2, 0, R9); // BPF_STX | BPF_MEM | BPF_DW
        a.st(Size::W, FP, -4, 0); // BPF_ST | BPF_MEM | BPF_W
        a.ldx(Size::DW, R1, R7, 8); // BPF_LDX | BPF_MEM | BPF_DW
        a.alu_x(MUL, R1, R2); // BPF_ALU64 | BPF_X | BPF_MUL
        a.alu_k(RSH, R1, 32); // BPF_ALU64 | BPF_K | BPF_RSH
        a.host_to_be(R1, 64); // BPF_ALU | BPF_END | BPF_TO_BE
        a.neg(R1); // BPF_ALU64 | BPF_NEG
        let codes: Vec<u8> = a.finish().iter().map(|i| i.code).collect();
        assert_eq!(codes, [0x7b, 0x62, 0x79, 0x2f, 0x77, 0xdc, 0x87]);
    }
}
