// The emulated CUDA driver's kernel images: reading NVRTC's CUBIN (its size, the kernels it
// names, the registers ptxas gave each) or PTX, and the module and function entry points.

#include "driver.h"

namespace emu_driver {
namespace {

uint64_t rd(const unsigned char* p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

// The size of a 64-bit little-endian ELF image for a CUDA device (EM_CUDA), 0 when it is not one.
size_t cuda_elf_size(const unsigned char* p) {
    if (p[4] != 2 || p[5] != 1 || rd(p + 0x12, 2) != 190) return 0;
    uint64_t phoff = rd(p + 0x20, 8), shoff = rd(p + 0x28, 8);
    uint64_t phent = rd(p + 0x36, 2), phnum = rd(p + 0x38, 2);
    uint64_t shent = rd(p + 0x3A, 2), shnum = rd(p + 0x3C, 2);
    uint64_t end = 64;
    if (phoff + phent * phnum > end) end = phoff + phent * phnum;
    if (shoff + shent * shnum > end) end = shoff + shent * shnum;
    for (uint64_t i = 0; i < shnum; i++) {
        const unsigned char* sh = p + shoff + i * shent;
        if (rd(sh + 4, 4) == 8) continue;  // SHT_NOBITS occupies no file bytes
        uint64_t e = rd(sh + 0x18, 8) + rd(sh + 0x20, 8);
        if (e > end) end = e;
    }
    return (size_t)end;
}

// The register count of every kernel of a CUBIN, from the EIATTR_REGCOUNT (0x2f) attributes
// of its .nv.info sections: (symbol index, registers), the symbol named in the symbol table.
// Attributes are (format, attribute, 2 bytes) with `size` more bytes for format 4 (EIFMT_SVAL).
std::map<std::string, unsigned> cubin_regcounts(const std::vector<unsigned char>& img) {
    std::map<std::string, unsigned> regs;
    const unsigned char* p = img.data();
    uint64_t shoff = rd(p + 0x28, 8), shent = rd(p + 0x3A, 2), shnum = rd(p + 0x3C, 2);
    uint64_t shstrndx = rd(p + 0x3E, 2);
    auto sec = [&](uint64_t i) { return p + shoff + i * shent; };
    auto str = [&](uint64_t strsec, uint64_t off) -> std::string {
        uint64_t o = rd(sec(strsec) + 0x18, 8) + off;
        if (o >= img.size()) return std::string();
        return std::string((const char*)p + o, strnlen((const char*)p + o, img.size() - o));
    };
    const unsigned char* symtab = nullptr;
    for (uint64_t i = 0; i < shnum; i++)
        if (rd(sec(i) + 4, 4) == 2) symtab = sec(i);  // SHT_SYMTAB
    if (symtab == nullptr) return regs;
    uint64_t symoff = rd(symtab + 0x18, 8), symsize = rd(symtab + 0x20, 8);
    uint64_t symstr = rd(symtab + 0x28, 4);
    for (uint64_t i = 0; i < shnum; i++) {
        if (str(shstrndx, rd(sec(i), 4)).rfind(".nv.info", 0) != 0) continue;
        uint64_t off = rd(sec(i) + 0x18, 8), end = off + rd(sec(i) + 0x20, 8);
        while (off + 4 <= end && end <= img.size()) {
            unsigned fmt = p[off], attr = p[off + 1];
            uint64_t size = fmt == 4 ? rd(p + off + 2, 2) : 0;
            if (fmt == 4 && attr == 0x2f && size >= 8) {
                uint64_t sym = rd(p + off + 4, 4), val = rd(p + off + 8, 4);
                if ((sym + 1) * 24 <= symsize)
                    regs[str(symstr, rd(p + symoff + sym * 24, 4))] = (unsigned)val;
            }
            off += 4 + size;
        }
    }
    return regs;
}

bool image_names(const Module* m, const char* name) {
    std::string needle = m->elf ? std::string(1, '\0') + name + std::string(1, '\0')
                                : std::string(".entry ") + name + "(";
    const unsigned char* b = m->image.data();
    return std::search(b, b + m->image.size(), needle.begin(), needle.end()) !=
           b + m->image.size();
}

}  // namespace
}  // namespace emu_driver

using namespace emu_driver;

// ---- modules and functions ----

API CUresult cuModuleLoadData(void** module, const void* image) {
    NEED_CTX("cuModuleLoadData");
    const unsigned char* p = (const unsigned char*)image;
    if (p == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuModuleLoadData: no image");
    Module* m = new Module;
    if (memcmp(p, "\x7f" "ELF", 4) == 0) {
        size_t n = cuda_elf_size(p);
        if (n == 0) {
            delete m;
            return fail(CUDA_ERROR_INVALID_IMAGE,
                        "cuModuleLoadData: an ELF image, but not a 64-bit CUDA one");
        }
        m->image.assign(p, p + n);
        m->elf = true;
        m->regs = cubin_regcounts(m->image);
    } else {
        size_t n = strlen((const char*)p);
        m->image.assign(p, p + n);
        m->elf = false;
        std::string text((const char*)p, n);
        if (text.find(".version") == std::string::npos ||
            text.find(".target sm_") == std::string::npos) {
            delete m;
            return fail(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData: neither a CUBIN nor PTX");
        }
    }
    S().modules.insert(m);
    *module = m;
    return CUDA_SUCCESS;
}

API CUresult cuModuleGetFunction(void** func, void* module, const char* name) {
    NEED_CTX("cuModuleGetFunction");
    if (S().modules.count(module) == 0)
        return fail(CUDA_ERROR_INVALID_HANDLE,
                    "cuModuleGetFunction(%s): not a loaded module", name);
    Module* m = (Module*)module;
    if (!image_names(m, name))
        return fail(CUDA_ERROR_NOT_FOUND, "cuModuleGetFunction(%s): the %s does not name it", name,
                    m->elf ? "CUBIN" : "PTX");
    size_t sizes[64];
    int n = dsv4_emu_params(name, sizes, 64);
    if (n < 0 || n > 64)
        return fail(CUDA_ERROR_NOT_FOUND,
                    "cuModuleGetFunction(%s): the emulator has no such kernel", name);
    unsigned regs = 0;
    if (m->elf) {
        auto r = m->regs.find(name);
        if (r == m->regs.end())
            return fail(CUDA_ERROR_INVALID_IMAGE,
                        "cuModuleGetFunction(%s): the CUBIN has no register count for it", name);
        regs = r->second;
    }
    Func* f = new Func{name, std::vector<size_t>(sizes, sizes + n), m, regs};
    S().funcs.insert(f);
    *func = f;
    return CUDA_SUCCESS;
}

API CUresult cuModuleUnload(void* module) {
    NEED_CTX("cuModuleUnload");
    if (S().modules.erase(module) == 0)
        return fail(CUDA_ERROR_INVALID_HANDLE, "cuModuleUnload(%p): not a loaded module", module);
    // Queued launches of its functions run first.
    drain_all();
    for (auto it = S().funcs.begin(); it != S().funcs.end();) {
        if (((Func*)*it)->module == module) {
            delete (Func*)*it;
            it = S().funcs.erase(it);
        } else {
            ++it;
        }
    }
    delete (Module*)module;
    return CUDA_SUCCESS;
}
