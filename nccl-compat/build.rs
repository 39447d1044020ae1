// The library is loaded as libnccl.so.2 (the name programs linked against NCCL ask for).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
}
