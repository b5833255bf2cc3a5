//! The one dispatch point between a `Device` and its backend. [`Gpu`] is an object-safe view of
//! [`Backend`] whose streams, buffers, functions, graphs and events are [`Erased`]; it is
//! implemented once, for every backend, by the blanket impl below, which turns each erased
//! value back into the backend's own type. A value of another backend (a CUDA buffer passed to
//! a HIP stream) fails that downcast and is refused with a typed error, where the per-vendor
//! enums needed a mismatch arm in every method.

use std::any::Any;

use super::backend::{check_launch, Backend, DeviceKind, Function, LaunchConfig};
use super::error::RuntimeError;
use super::hold::HoldWait;
use crate::arch::tma::{TensorMapSpec, MAP_BYTES};
use crate::arch::LaunchLimits;

/// A backend value behind `dyn Any`, taken back with [`Erased::get`].
pub struct Erased(Box<dyn Any + Send + Sync>);

impl Erased {
    pub(super) fn new<T: Any + Send + Sync>(value: T) -> Erased {
        Erased(Box::new(value))
    }

    /// The value as `T`, or the refusal of a value of another backend.
    pub(super) fn get<T: Any>(&self) -> Result<&T, RuntimeError> {
        self.0.downcast_ref::<T>().ok_or_else(foreign)
    }

    /// Identifies the value while it lives (the address of its heap cell).
    pub(super) fn id(&self) -> usize {
        &*self.0 as *const (dyn Any + Send + Sync) as *const () as usize
    }
}

/// A captured graph behind `dyn Any`: `Send` only, as the backends' graphs are.
pub struct ErasedGraph(Box<dyn Any + Send>);

pub(super) fn foreign() -> RuntimeError {
    RuntimeError::NoDevice {
        spec: "mixed".into(),
        reason: "a buffer, kernel, graph or marker of another kind of device was passed to this \
                 stream"
            .into(),
    }
}

/// A kernel loaded on a device. Shared read-only by every execution.
pub struct LoadedKernel(pub(super) Erased);

/// One launch bound to raw handles (made by [`Gpu::bind`], launched by [`Gpu::launch_bound`]).
struct Bound<B: Backend> {
    f: B::RawFunction,
    config: LaunchConfig,
    args: Vec<B::RawAddress>,
}

/// [`Backend`] with its associated types erased: what a `Device` holds.
pub(super) trait Gpu: Send + Sync {
    fn kind(&self) -> DeviceKind;
    fn toolchain(&self) -> String;
    fn runtime_library(&self) -> Option<&str>;
    fn compile(
        &self,
        source: &str,
        entry: &str,
        options: &[String],
    ) -> Result<Vec<u8>, RuntimeError>;
    fn load(&self, image: &[u8], entry: &str) -> Result<LoadedKernel, RuntimeError>;
    fn new_stream(&self) -> Result<Erased, RuntimeError>;
    fn alloc(&self, stream: &Erased, bytes: usize, poison: bool) -> Result<Erased, RuntimeError>;
    fn encode_tensor_map(
        &self,
        stream: &Erased,
        buf: &Erased,
        offset: usize,
        spec: &TensorMapSpec,
    ) -> Result<[u8; MAP_BYTES], RuntimeError>;
    fn upload(&self, stream: &Erased, data: &[u8]) -> Result<Erased, RuntimeError>;
    /// The device addresses of `bufs` (each at its byte offset), as little-endian u64.
    fn address_table(
        &self,
        stream: &Erased,
        bufs: &[(&Erased, usize)],
    ) -> Result<Vec<u8>, RuntimeError>;
    fn resident_blocks(
        &self,
        kernel: &LoadedKernel,
        threads: u32,
        shared: u32,
    ) -> Result<Option<u32>, RuntimeError>;
    fn download(
        &self,
        stream: &Erased,
        buf: &Erased,
        bytes: usize,
    ) -> Result<Vec<u8>, RuntimeError>;
    fn write(&self, stream: &Erased, buf: &Erased, data: &[u8]) -> Result<(), RuntimeError>;
    fn fill(
        &self,
        stream: &Erased,
        buf: &Erased,
        byte: u8,
        bytes: usize,
    ) -> Result<(), RuntimeError>;
    fn copy(
        &self,
        stream: &Erased,
        src: &Erased,
        dst: &Erased,
        bytes: usize,
    ) -> Result<(), RuntimeError>;
    fn launch(
        &self,
        stream: &Erased,
        kernel: &LoadedKernel,
        config: &LaunchConfig,
        args: &[&Erased],
    ) -> Result<(), RuntimeError>;
    /// `offsets`: bytes into each of `args` (same length).
    fn bind(
        &self,
        stream: &Erased,
        kernel: &LoadedKernel,
        config: &LaunchConfig,
        args: &[&Erased],
        offsets: &[usize],
    ) -> Result<Erased, RuntimeError>;
    fn launch_bound(&self, stream: &Erased, bound: &Erased) -> Result<(), RuntimeError>;
    fn graph_support(&self) -> Result<(), String>;
    fn capture(
        &self,
        stream: &Erased,
        enqueue: &mut dyn FnMut() -> Result<(), RuntimeError>,
    ) -> Result<ErasedGraph, RuntimeError>;
    fn replay(&self, stream: &Erased, graph: &ErasedGraph) -> Result<(), RuntimeError>;
    fn sync(&self, stream: &Erased) -> Result<(), RuntimeError>;
    fn mark(&self, stream: &Erased) -> Result<Erased, RuntimeError>;
    fn reached(&self, event: &Erased) -> Result<bool, RuntimeError>;
    fn elapsed_ms(&self, start: &Erased, end: &Erased) -> Result<f32, RuntimeError>;
    fn hold(&self, stream: &Erased, wait: HoldWait) -> Result<(), RuntimeError>;
    /// Checks `config` against the device's limits.
    fn check(&self, config: &LaunchConfig) -> Result<(), RuntimeError>;
}

fn buffers<'a, B: Backend>(args: &[&'a Erased]) -> Result<Vec<&'a B::Buffer>, RuntimeError> {
    args.iter().map(|a| a.get::<B::Buffer>()).collect()
}

impl<B: Backend> Gpu for B {
    fn kind(&self) -> DeviceKind {
        B::KIND
    }

    fn toolchain(&self) -> String {
        Backend::toolchain(self)
    }

    fn runtime_library(&self) -> Option<&str> {
        Backend::runtime_library(self)
    }

    fn compile(
        &self,
        source: &str,
        entry: &str,
        options: &[String],
    ) -> Result<Vec<u8>, RuntimeError> {
        Backend::compile(self, source, entry, options)
    }

    fn load(&self, image: &[u8], entry: &str) -> Result<LoadedKernel, RuntimeError> {
        let f = Backend::load(self, image, entry)?;
        Ok(LoadedKernel(Erased::new(Function::new(f))))
    }

    fn new_stream(&self) -> Result<Erased, RuntimeError> {
        Backend::new_stream(self).map(Erased::new)
    }

    fn alloc(&self, stream: &Erased, bytes: usize, poison: bool) -> Result<Erased, RuntimeError> {
        Backend::alloc(self, stream.get()?, bytes, poison).map(Erased::new)
    }

    fn encode_tensor_map(
        &self,
        stream: &Erased,
        buf: &Erased,
        offset: usize,
        spec: &TensorMapSpec,
    ) -> Result<[u8; MAP_BYTES], RuntimeError> {
        Backend::encode_tensor_map(self, stream.get()?, buf.get()?, offset, spec)
    }

    fn upload(&self, stream: &Erased, data: &[u8]) -> Result<Erased, RuntimeError> {
        Backend::upload(self, stream.get()?, data).map(Erased::new)
    }

    fn address_table(
        &self,
        stream: &Erased,
        bufs: &[(&Erased, usize)],
    ) -> Result<Vec<u8>, RuntimeError> {
        let s = stream.get::<B::Stream>()?;
        let mut table = Vec::with_capacity(8 * bufs.len());
        for &(b, offset) in bufs {
            let a = self.raw_address(s, b.get::<B::Buffer>()?, offset);
            table.extend_from_slice(&B::address_value(a).to_le_bytes());
        }
        Ok(table)
    }

    fn resident_blocks(
        &self,
        kernel: &LoadedKernel,
        threads: u32,
        shared: u32,
    ) -> Result<Option<u32>, RuntimeError> {
        let f = kernel.0.get::<Function<B::Function>>()?;
        Ok(Backend::resident_blocks(self, &f.f, threads, shared))
    }

    fn download(
        &self,
        stream: &Erased,
        buf: &Erased,
        bytes: usize,
    ) -> Result<Vec<u8>, RuntimeError> {
        Backend::download(self, stream.get()?, buf.get()?, bytes)
    }

    fn write(&self, stream: &Erased, buf: &Erased, data: &[u8]) -> Result<(), RuntimeError> {
        Backend::write(self, stream.get()?, buf.get()?, data)
    }

    fn fill(
        &self,
        stream: &Erased,
        buf: &Erased,
        byte: u8,
        bytes: usize,
    ) -> Result<(), RuntimeError> {
        Backend::fill(self, stream.get()?, buf.get()?, byte, bytes)
    }

    fn copy(
        &self,
        stream: &Erased,
        src: &Erased,
        dst: &Erased,
        bytes: usize,
    ) -> Result<(), RuntimeError> {
        Backend::copy(self, stream.get()?, src.get()?, dst.get()?, bytes)
    }

    fn launch(
        &self,
        stream: &Erased,
        kernel: &LoadedKernel,
        config: &LaunchConfig,
        args: &[&Erased],
    ) -> Result<(), RuntimeError> {
        let s = stream.get::<B::Stream>()?;
        let f = kernel.0.get::<Function<B::Function>>()?;
        let args = buffers::<B>(args)?;
        self.prepare(f, &config.attrs)?;
        Backend::launch(self, s, &f.f, config, &args)
    }

    fn bind(
        &self,
        stream: &Erased,
        kernel: &LoadedKernel,
        config: &LaunchConfig,
        args: &[&Erased],
        offsets: &[usize],
    ) -> Result<Erased, RuntimeError> {
        let s = stream.get::<B::Stream>()?;
        let f = kernel.0.get::<Function<B::Function>>()?;
        let args = buffers::<B>(args)?;
        // Attributes are applied at bind time: a capture records launches, not attribute calls.
        self.prepare(f, &config.attrs)?;
        Ok(Erased::new(Bound::<B> {
            f: B::raw_function(&f.f),
            config: *config,
            args: args
                .iter()
                .zip(offsets)
                .map(|(b, &o)| self.raw_address(s, b, o))
                .collect(),
        }))
    }

    fn launch_bound(&self, stream: &Erased, bound: &Erased) -> Result<(), RuntimeError> {
        let b = bound.get::<Bound<B>>()?;
        Backend::launch_raw(self, stream.get()?, b.f, &b.config, &b.args)
    }

    fn graph_support(&self) -> Result<(), String> {
        Backend::graph_support(self)
    }

    fn capture(
        &self,
        stream: &Erased,
        enqueue: &mut dyn FnMut() -> Result<(), RuntimeError>,
    ) -> Result<ErasedGraph, RuntimeError> {
        let g = Backend::capture(self, stream.get()?, enqueue)?;
        Ok(ErasedGraph(Box::new(g)))
    }

    fn replay(&self, stream: &Erased, graph: &ErasedGraph) -> Result<(), RuntimeError> {
        let g = graph.0.downcast_ref::<B::Graph>().ok_or_else(foreign)?;
        Backend::replay(self, stream.get()?, g)
    }

    fn sync(&self, stream: &Erased) -> Result<(), RuntimeError> {
        Backend::sync(self, stream.get()?)
    }

    fn mark(&self, stream: &Erased) -> Result<Erased, RuntimeError> {
        Backend::mark(self, stream.get()?).map(Erased::new)
    }

    fn reached(&self, event: &Erased) -> Result<bool, RuntimeError> {
        Backend::reached(self, event.get()?)
    }

    fn elapsed_ms(&self, start: &Erased, end: &Erased) -> Result<f32, RuntimeError> {
        Backend::elapsed_ms(self, start.get()?, end.get()?)
    }

    fn hold(&self, stream: &Erased, wait: HoldWait) -> Result<(), RuntimeError> {
        Backend::hold(self, stream.get()?, wait)
    }

    fn check(&self, config: &LaunchConfig) -> Result<(), RuntimeError> {
        let limits: LaunchLimits = self.launch_limits();
        check_launch(&limits, self.shared_limits(), config)
    }
}
