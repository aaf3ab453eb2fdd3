//! # cachealloc-vmm
//!
//! Mapping pages into a reserved range, all or none, on a driver's virtual
//! memory API (CUDA's `cuMem*`, HIP's `hipMem*`, which have the same
//! shape): create one physical allocation per page, map each at its
//! address, grant the device read-write access to the whole range; if any
//! step fails, unmap what this call mapped and release what it created, and
//! report the first failure. The CUDA and HIP backends implement
//! [`PageDriver`] with their driver calls and share [`map_with_rollback`].
//!
//! ```
//! use cachealloc_vmm::{map_with_rollback, PageDriver};
//! /// A driver whose third page creation fails.
//! #[derive(Default)]
//! struct Toy { created: u32, live: i32, mapped: i32 }
//! impl PageDriver for Toy {
//!     type Handle = u32;
//!     type Error = &'static str;
//!     fn create(&mut self, _size: u64) -> Result<u32, &'static str> {
//!         self.created += 1;
//!         if self.created == 3 { return Err("no memory"); }
//!         self.live += 1;
//!         Ok(self.created)
//!     }
//!     fn map(&mut self, _addr: u64, _size: u64, _h: u32) -> Result<(), &'static str> {
//!         self.mapped += 1;
//!         Ok(())
//!     }
//!     fn set_access(&mut self, _addr: u64, _size: u64) -> Result<(), &'static str> { Ok(()) }
//!     fn unmap(&mut self, _addr: u64, _size: u64) { self.mapped -= 1; }
//!     fn release(&mut self, _h: u32) { self.live -= 1; }
//! }
//! let mut d = Toy::default();
//! assert_eq!(map_with_rollback(&mut d, 1 << 21, 4, 1 << 21), Err("no memory"));
//! assert_eq!((d.live, d.mapped), (0, 0)); // nothing left behind
//! let mut d = Toy { created: 10, ..Toy::default() };
//! let pages = map_with_rollback(&mut d, 1 << 21, 2, 1 << 21).unwrap();
//! assert_eq!(pages, vec![(1 << 21, 11), (2 << 21, 12)]);
//! ```

#[cfg(target_os = "linux")]
mod pidfd;
#[cfg(target_os = "linux")]
pub use pidfd::{take_fds, take_fds_message};

/// The driver calls that map pages. The undo calls are best effort: the
/// failure being undone is what gets reported.
pub trait PageDriver {
    /// A physical allocation (`CUmemGenericAllocationHandle`,
    /// `hipMemGenericAllocationHandle_t`).
    type Handle: Copy;
    /// The driver's failure.
    type Error;
    /// Create a physical allocation of `size` bytes (`cuMemCreate`).
    fn create(&mut self, size: u64) -> Result<Self::Handle, Self::Error>;
    /// Map `handle` at `addr`, inside a reservation (`cuMemMap`).
    fn map(&mut self, addr: u64, size: u64, handle: Self::Handle) -> Result<(), Self::Error>;
    /// Grant the device read-write access to `size` mapped bytes from
    /// `addr` (`cuMemSetAccess`).
    fn set_access(&mut self, addr: u64, size: u64) -> Result<(), Self::Error>;
    /// Undo a [`map`](Self::map) (`cuMemUnmap`).
    fn unmap(&mut self, addr: u64, size: u64);
    /// Undo a [`create`](Self::create) (`cuMemRelease`).
    fn release(&mut self, handle: Self::Handle);
}

/// Map `pages` pages of `page` bytes from `base`: every page created, then
/// every page mapped, then access granted to the range (the order of
/// PyTorch's `ExpandableSegment::map`). The pages with their handles, in
/// address order; on a failure, nothing stays created or mapped.
pub fn map_with_rollback<D: PageDriver>(
    driver: &mut D,
    base: u64,
    pages: u64,
    page: u64,
) -> Result<Vec<(u64, D::Handle)>, D::Error> {
    let mut made: Vec<(u64, D::Handle)> = Vec::new();
    let mut mapped = 0usize;
    let mut steps = || -> Result<(), D::Error> {
        for k in 0..pages {
            made.push((base + k * page, driver.create(page)?));
        }
        for &(addr, h) in &made {
            driver.map(addr, page, h)?;
            mapped += 1;
        }
        driver.set_access(base, pages * page)
    };
    match steps() {
        Ok(()) => Ok(made),
        Err(e) => {
            for (k, &(addr, h)) in made.iter().enumerate() {
                if k < mapped {
                    driver.unmap(addr, page);
                }
                driver.release(h);
            }
            Err(e)
        }
    }
}

/// Fill `fds` with the POSIX file descriptors of the `fds.len()` pages of
/// `page` bytes from `base`: a page's descriptor from before (`exported`),
/// else a new one from `export` of its allocation (`pages`, by address),
/// kept in `exported` (a page keeps its descriptor until it is unmapped).
/// A page not in `pages` is `missing(address)`.
pub fn export_pages<H: Copy, E>(
    pages: &std::collections::BTreeMap<u64, H>,
    exported: &mut std::collections::BTreeMap<u64, i32>,
    base: u64,
    page: u64,
    fds: &mut [i32],
    mut export: impl FnMut(H) -> Result<i32, E>,
    missing: impl Fn(u64) -> E,
) -> Result<(), E> {
    for (k, out) in fds.iter_mut().enumerate() {
        let addr = base + k as u64 * page;
        if let Some(&fd) = exported.get(&addr) {
            *out = fd;
            continue;
        }
        let h = *pages.get(&addr).ok_or_else(|| missing(addr))?;
        let fd = export(h)?;
        exported.insert(addr, fd);
        *out = fd;
    }
    Ok(())
}

/// The driver calls that map another process's pages here: those of
/// [`PageDriver`] (map, access, unmap, release), plus importing a page's
/// exported POSIX file descriptor (`cuMemImportFromShareableHandle`) and
/// reserving and freeing address space (`cuMemAddressReserve`,
/// `cuMemAddressFree`).
pub trait ImportDriver: PageDriver {
    /// The physical allocation behind exported descriptor `fd` (open in
    /// this process; the caller closes it).
    fn import(&mut self, fd: i32) -> Result<Self::Handle, Self::Error>;
    /// Reserve `size` bytes of address space; its base.
    fn reserve(&mut self, size: u64) -> Result<u64, Self::Error>;
    /// Undo a [`reserve`](Self::reserve) (best effort).
    fn free_reservation(&mut self, base: u64, size: u64);
}

/// Import the pages behind descriptors `fds` (a page of `page` bytes
/// each), reserve exactly the address space they fill, map them there in
/// order and grant the device access (the receiving side of PyTorch's
/// `ExpandableSegment::fromShared`). The base and the handles; on a
/// failure nothing stays imported, reserved or mapped.
///
/// ```
/// use cachealloc_vmm::{import_with_rollback, ImportDriver, PageDriver};
/// /// A driver whose second map fails.
/// #[derive(Default)]
/// struct Toy { live: i32, mapped: i32, reserved: u64 }
/// impl PageDriver for Toy {
///     type Handle = i32;
///     type Error = &'static str;
///     fn create(&mut self, _size: u64) -> Result<i32, &'static str> { unreachable!() }
///     fn map(&mut self, _addr: u64, _size: u64, _h: i32) -> Result<(), &'static str> {
///         if self.mapped == 1 { return Err("map failed"); }
///         self.mapped += 1;
///         Ok(())
///     }
///     fn set_access(&mut self, _addr: u64, _size: u64) -> Result<(), &'static str> { Ok(()) }
///     fn unmap(&mut self, _addr: u64, _size: u64) { self.mapped -= 1; }
///     fn release(&mut self, _h: i32) { self.live -= 1; }
/// }
/// impl ImportDriver for Toy {
///     fn import(&mut self, fd: i32) -> Result<i32, &'static str> { self.live += 1; Ok(fd) }
///     fn reserve(&mut self, size: u64) -> Result<u64, &'static str> { self.reserved += size; Ok(1 << 40) }
///     fn free_reservation(&mut self, _base: u64, size: u64) { self.reserved -= size; }
/// }
/// let mut d = Toy::default();
/// assert_eq!(import_with_rollback(&mut d, &[5, 6], 1 << 21), Err("map failed"));
/// assert_eq!((d.live, d.mapped, d.reserved), (0, 0, 0)); // nothing left behind
/// let mut d = Toy::default();
/// assert_eq!(import_with_rollback(&mut d, &[5], 1 << 21), Ok((1 << 40, vec![5])));
/// assert_eq!(d.reserved, 1 << 21); // exactly what the pages fill
/// ```
pub fn import_with_rollback<D: ImportDriver>(
    driver: &mut D,
    fds: &[i32],
    page: u64,
) -> Result<(u64, Vec<D::Handle>), D::Error> {
    let mut handles: Vec<D::Handle> = Vec::with_capacity(fds.len());
    let release = |driver: &mut D, handles: &[D::Handle]| {
        for &h in handles {
            driver.release(h);
        }
    };
    for &fd in fds {
        match driver.import(fd) {
            Ok(h) => handles.push(h),
            Err(e) => {
                release(driver, &handles);
                return Err(e);
            }
        }
    }
    // Sizes another process sent: an overflow is refused by the reservation
    // of an impossible size, never wrapped into a small one.
    let size = page.saturating_mul(handles.len() as u64);
    let base = match driver.reserve(size) {
        Ok(b) => b,
        Err(e) => {
            release(driver, &handles);
            return Err(e);
        }
    };
    let mut mapped = 0u64;
    let mut failure = None;
    for &h in &handles {
        if let Err(e) = driver.map(base + mapped * page, page, h) {
            failure = Some(e);
            break;
        }
        mapped += 1;
    }
    if failure.is_none() {
        failure = driver.set_access(base, size).err();
    }
    match failure {
        None => Ok((base, handles)),
        Some(e) => {
            for k in 0..mapped {
                driver.unmap(base + k * page, page);
            }
            release(driver, &handles);
            driver.free_reservation(base, size);
            Err(e)
        }
    }
}
