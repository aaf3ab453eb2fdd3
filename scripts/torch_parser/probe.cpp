// torch's own settings parser, as the reference for cachealloc's: reads
// settings strings from stdin, one per line, parses each in a fresh child
// process with the wheel's libc10 / libc10_cuda (c10's
// setAllocatorSettings, what torch.cuda.memory._set_allocator_settings
// calls; no GPU needed), and prints what torch made of it as one JSON line:
// {"string", "ok", "error" or the values}. A line of several strings
// separated by tabs parses them in turn, as later strings
// (_set_allocator_settings called again), and reports after the last.
// Built and run by
// scripts/torch-parser.sh with -DTORCH_MINOR=<the release's minor>.
#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDAAllocatorConfig.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

namespace {

std::string quoted(const std::string& s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else {
                    out += static_cast<char>(c);
                }
        }
    }
    return out + "\"";
}

std::string number(double x) {
    std::ostringstream o;
    o.precision(17);
    o << x;
    return o.str();
}

void probe(const std::string& s) {
    using A = c10::CachingAllocator::AcceleratorAllocatorConfig;
    using C = c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig;
    A::instance();
    C::instance();
    std::string out = "{\"string\":" + quoted(s);
    try {
        std::istringstream each(s);
        std::string one;
        while (std::getline(each, one, '\t')) c10::CachingAllocator::setAllocatorSettings(one);
    } catch (const c10::Error& e) {
        std::cout << out << ",\"ok\":false,\"error\":" << quoted(e.what_without_backtrace()) << "}"
                  << std::endl;
        return;
    } catch (const std::exception& e) {
        std::cout << out << ",\"ok\":false,\"error\":" << quoted(e.what()) << "}" << std::endl;
        return;
    }
    out += ",\"ok\":true";
    out += ",\"large_segment_size\":" + std::to_string(A::large_segment_size());
    out += ",\"max_split_size\":" + std::to_string(A::max_split_size());
    out += ",\"max_non_split_rounding_size\":" + std::to_string(A::max_non_split_rounding_size());
    out += ",\"roundup_power2_divisions\":[";
    const auto& d = A::roundup_power2_divisions();
    for (size_t i = 0; i < d.size(); i++) out += (i ? "," : "") + std::to_string(d[i]);
    out += "]";
    out += ",\"garbage_collection_threshold\":" + number(A::garbage_collection_threshold());
    out += ",\"expandable_segments\":" + std::string(A::use_expandable_segments() ? "true" : "false");
    out += ",\"release_lock_on_cudamalloc\":" + std::string(C::release_lock_on_cudamalloc() ? "true" : "false");
    out += ",\"graph_capture_record_stream_reuse\":" +
           std::string(C::graph_capture_record_stream_reuse() ? "true" : "false");
    out += ",\"per_process_memory_fraction\":" + number(C::per_process_memory_fraction());
    out += ",\"pinned_use_cuda_host_register\":" +
           std::string(C::pinned_use_cuda_host_register() ? "true" : "false");
    out += ",\"pinned_num_register_threads\":" + std::to_string(C::pinned_num_register_threads());
    out += ",\"pinned_use_background_threads\":" +
           std::string(A::pinned_use_background_threads() ? "true" : "false");
    out += ",\"pinned_reserve_segment_size_mb\":" + std::to_string(C::pinned_reserve_segment_size_mb());
#if TORCH_MINOR >= 12
    out += ",\"throw_on_cudamalloc_oom\":" + std::string(C::throw_on_cudamalloc_oom() ? "true" : "false");
    out += ",\"pinned_free_catch_all\":" + std::string(C::pinned_free_catch_all() ? "true" : "false");
#endif
#if TORCH_MINOR >= 13
    out += ",\"pinned_max_round_threshold\":" + std::to_string(A::pinned_max_round_threshold());
    out += ",\"pinned_max_cached_size\":" + std::to_string(A::pinned_max_cached_size());
#endif
    std::cout << out << "}" << std::endl;
}

}  // namespace

int main() {
    std::string line;
    while (std::getline(std::cin, line)) {
        std::cout.flush();
        pid_t pid = fork();
        if (pid == 0) {
            probe(line);
            std::cout.flush();
            _exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            std::cout << "{\"string\":" << quoted(line) << ",\"ok\":false,\"error\":\"the parser crashed\"}"
                      << std::endl;
        }
    }
    return 0;
}
