//! The dsv4 op set, the Backend trait and the backend registry.
